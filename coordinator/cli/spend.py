"""``budgetctl spend``: spend of the trees closed on one UTC day: the total, by org, team
and service, the trees with none of those labels, and by provider and model."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..store.model_spend import MODEL, model_of
from ..store.views import SPEND_LABELS
from ._common import connect, console, print_json
from .help_format import PlainCommand, PlainGroup
from .rows import usd

app = typer.Typer(cls=PlainGroup)

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_day(value: str | None) -> str:
    """``YYYY-MM-DD`` of a UTC day given as such (a day that exists), ``today`` or
    ``yesterday`` (default: today); anything else is a usage error (exit 2)."""
    today = datetime.now(timezone.utc).date()
    if value is None or value == "today":
        return today.isoformat()
    if value == "yesterday":
        return (today - timedelta(days=1)).isoformat()
    try:
        if _DAY.match(value):
            return date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    raise typer.BadParameter(
        f"{value!r} is not a day: give YYYY-MM-DD (a UTC day that exists), 'today' or "
        f"'yesterday'", param_hint="'--day'")


def _largest_first(view: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(view.items(), key=lambda kv: (-kv[1], kv[0]))


def spend_table(day: str, by: dict[str, dict[str, int]], totals: dict[str, int]
                ) -> RenderableType:
    """The day's total, spend by label (largest first), the unlabelled trees and spend
    by ``provider|model``."""
    if not totals["all"] and not any(by.values()):
        return Text(f"no spend in trees closed on {day} (UTC)")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("LABEL", no_wrap=True)
    table.add_column("VALUE", overflow="fold")
    table.add_column("SPENT", justify="right", no_wrap=True)
    table.add_row("total", "every tree", usd(totals["all"]), style="bold")
    for label in SPEND_LABELS:
        for value, micro in _largest_first(by[label]):
            table.add_row(label, value, usd(micro))
    table.add_row("unlabelled", "no org, team or service", usd(totals["unlabelled"]))
    for value, micro in _largest_first(by[MODEL]):
        table.add_row(MODEL, value, usd(micro))
    return Group(Text(f"spend of trees closed on {day} (UTC); a tree counts once in the "
                      f"total and once under each label it has; model: provider|model, the "
                      f"rows sum to the total", style="dim"), table)


@app.command(cls=PlainCommand)
def spend(
    ctx: typer.Context,
    day: Annotated[str | None, typer.Option(
        metavar="DAY", help="YYYY-MM-DD (UTC), 'today' (default) or 'yesterday'.")] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print JSON (shape: docs/cli.md).")] = False,
) -> None:
    """Spend of the trees closed on one UTC day: the total, by label, by model.

    By org, team and service, the unlabelled trees, and by provider and model. Each
    tree is counted once, at its root; days are kept for the coordinator's retention."""
    the_day = parse_day(day)
    with connect(ctx) as coord:
        by = {label: coord.views.spend_view(label, the_day)
              for label in (*SPEND_LABELS, MODEL)}
        totals = coord.views.spend_totals(the_day)
    if json_out:
        data: dict[str, Any] = {
            "day": the_day, "total_usd": totals["all"] / 1e6,
            "unlabelled_usd": totals["unlabelled"] / 1e6,
            "by": {label: {value: micro / 1e6 for value, micro in _largest_first(view)}
                   for label, view in by.items() if label != MODEL},
            "models": [{**model_of(value), "usd": micro / 1e6}
                       for value, micro in _largest_first(by[MODEL])]}
        print_json(lambda: data, None)
        return
    console().print(spend_table(the_day, by, totals))
