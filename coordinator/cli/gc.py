"""``budgetctl gc``: find the trees left open by processes that died, list them or close
them and set them to expire."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..store.gc import GcReport, gc
from ._common import connect
from .help_format import PlainCommand, PlainGroup
from .rows import age, plural, usd

app = typer.Typer(cls=PlainGroup)

DEFAULT_IDLE_S = 86_400.0
"""How long a tree must have been idle for `gc` to take it (a day)."""


def gc_json(report: GcReport) -> dict[str, Any]:
    """The stable JSON shape of `gc` (docs/cli.md)."""
    return {"dry_run": report.dry_run, "open": report.open, "examined": report.examined,
            "expired": report.expired, "stale": report.stale,
            "idle": [{"id": t.root, "idle_s": round(t.idle_s, 3), "contexts": t.contexts,
                      "spent_usd": t.spent_usd} for t in report.idle]}


def gc_text(report: GcReport, idle_s: float) -> str:
    """What `gc` found and did, one line per idle tree, then a summary line."""
    lines = [f"{t.root}  idle {age(int(t.idle_s * 1000))}  "
             f"{plural(t.contexts, 'context')}  spent {usd(int(t.spent_usd * 1e6))}"
             for t in report.idle]
    span = age(int(idle_s * 1000)) if idle_s >= 1 else f"{idle_s:g}s"
    found = (f"{plural(len(report.idle), 'tree')} idle for {span} or more among "
             f"{plural(report.open, 'open tree')} ({report.examined} created {span} "
             f"or more ago)")
    if report.dry_run:
        lines.append(f"{found}; dry run: nothing changed (run without --dry-run to close "
                     f"and expire them)")
    else:
        lines.append(f"{found}; closed and set to expire: {report.expired}; index entries "
                     f"of trees already gone removed: {report.stale}")
    return "\n".join(lines)


@app.command(name="gc", cls=PlainCommand)
def gc_command(
    ctx: typer.Context,
    idle: Annotated[float, typer.Option(
        "--idle", metavar="SECONDS", min=0.0, max=315_360_000.0,  # (ten years)
        help="Take the open trees with no activity (call, stop, lease) for this long.")
    ] = DEFAULT_IDLE_S,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List the idle trees; change nothing.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print JSON (shape: docs/cli.md).")] = False,
) -> None:
    """Close and expire the trees left open by processes that died.

    A tree idle for --idle seconds is closed; its keys expire after the retention
    (BUDGET_RETENTION_S)."""
    with connect(ctx) as coord:
        report = gc(coord.store, coord.retention_s, idle, dry_run)
    if json_out:
        print(json.dumps(gc_json(report), indent=2, ensure_ascii=False))
    else:
        print(gc_text(report, idle))
