"""``budgetctl spend``: spend of the trees closed on one UTC day, by org, team and
service."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..store.views import SPEND_LABELS
from ._common import connect, console, print_json
from .rows import usd

app = typer.Typer()

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


def spend_table(day: str, by: dict[str, dict[str, int]]) -> RenderableType:
    """Spend by label, largest first."""
    if not any(by.values()):
        return Text(f"no trees with an org, team or service label closed on {day} (UTC)")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("LABEL", no_wrap=True)
    table.add_column("VALUE", overflow="fold")
    table.add_column("SPENT", justify="right", no_wrap=True)
    for label in SPEND_LABELS:
        for value, micro in sorted(by[label].items(), key=lambda kv: (-kv[1], kv[0])):
            table.add_row(label, value, usd(micro))
    return Group(Text(f"spend of trees closed on {day} (UTC)", style="dim"), table)


@app.command()
def spend(
    ctx: typer.Context,
    day: Annotated[str | None, typer.Option(
        metavar="DAY", help="YYYY-MM-DD (UTC), 'today' (default) or 'yesterday'.")] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print JSON (shape: docs/cli.md).")] = False,
) -> None:
    """Spend of the trees closed on one UTC day, by org, team and service.

    Each tree is counted once, at its root; days are kept for the coordinator's
    retention."""
    the_day = parse_day(day)
    with connect(ctx) as coord:
        by = {label: coord.views.spend_view(label, the_day) for label in SPEND_LABELS}
    if json_out:
        data: dict[str, Any] = {
            "day": the_day,
            "by": {label: {value: micro / 1e6 for value, micro in sorted(
                view.items(), key=lambda kv: (-kv[1], kv[0]))} for label, view in by.items()}}
        print_json(lambda: data, None)
        return
    console().print(spend_table(the_day, by))
