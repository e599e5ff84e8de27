"""``budgetctl top``: the open trees, their spend against each root's ceiling."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ._common import JsonOption, WatchOption, connect, print_json, show
from .help_format import PlainCommand, PlainGroup
from .reads import Top, read_top
from .rows import Row, age, plural, usd

app = typer.Typer(cls=PlainGroup)


class Sort(str, Enum):
    """What `top` puts first."""

    spend = "spend"
    fraction = "fraction"
    age = "age"


def burn(top: Top, r: Row) -> float | None:
    """A running tree's USD per minute over the last minute (None: not running, or not
    rated: no dashboard indexer runs), the number the dashboard shows."""
    return top.burn.get(r.id) if r.status == "running" else None


def top_json(top: Top, sort: str) -> dict[str, Any]:
    """The stable JSON shape of `top` (docs/cli.md)."""
    return {"total": top.total, "shown": len(top.rows), "more": top.total - len(top.rows),
            "sort": sort, "trees": [{**r.as_json(top.now_ms), "usd_per_min": burn(top, r)}
                                    for r in top.rows]}


def top_table(top: Top, sort: str) -> RenderableType:
    """The open trees as a table, with what it leaves out said below it."""
    if not top.rows:
        return Text("no open trees")
    table = Table(box=None, header_style="bold", pad_edge=False)
    width = max(len(r.id) for r in top.rows)
    table.add_column("TREE", no_wrap=True, min_width=width)
    table.add_column("NAME", overflow="fold")
    for name in ("SPENT", "CEILING", "USED", "RESERVED", "CALLS", "AGE", "BURN/MIN"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("STATUS", overflow="fold")
    for r in top.rows:
        table.add_row(r.id, r.name, usd(r.used), usd(r.limit),
                      f"{100 * r.fraction:.0f}%" if r.limit else "-",
                      usd(r.held) if r.held else "-", plural(r.calls, "call"),
                      age(top.now_ms - r.created_ms) if r.created_ms else "-",
                      _burn_text(burn(top, r)), r.state)
    more = top.total - len(top.rows)
    order = {"spend": "largest spend", "fraction": "largest share of the ceiling used",
             "age": "newest"}[sort]
    note = (f"{len(top.rows)} of {top.total} open trees, {order} first; {more} more, "
            f"use --limit" if more > 0 else
            f"{plural(top.total, 'open tree')}, {order} first")
    if sort != "age" and top.total > top.sorted_among:
        note += f" (sorted among the {top.sorted_among:,} newest)"
    return Group(table, Text(note, style="dim"))


def _burn_text(rate: float | None) -> str:
    return "-" if rate is None else f"${rate:.4f}"


@app.command(cls=PlainCommand)
def top(
    ctx: typer.Context,
    sort: Annotated[Sort, typer.Option(
        help="spend: largest spend first; fraction: closest to the ceiling first; "
             "age: newest first.")] = Sort.spend,
    limit: Annotated[int, typer.Option(min=1, max=1_000_000, metavar="N",
                                       help="How many trees to show.")] = 20,
    json_out: JsonOption = False,
    watch: WatchOption = None,
) -> None:
    """Open trees with spend against each root's ceiling (largest spend first)."""
    with connect(ctx) as coord:
        if json_out:
            print_json(lambda: top_json(read_top(coord, sort.value, limit), sort.value),
                       watch)
            return
        show(lambda: top_table(read_top(coord, sort.value, limit), sort.value), watch,
             "budgetctl top")
