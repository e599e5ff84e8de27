"""``budgetctl demo``: runs coordinator.demo, imported only when the command runs (the
demo needs Celery, which the rest of budgetctl does not)."""

from __future__ import annotations

import typer

from ._common import redis_url
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(cls=PlainGroup)


@app.command(cls=PlainCommand)
def demo(ctx: typer.Context) -> None:
    """Sub-agents on two Celery workers under one ceiling, then an abort.

    Uses --redis (or the configured Redis) if it answers, else starts an embedded one."""
    from ..demo import run_demo
    from .tree import tree_text

    raise typer.Exit(run_demo(redis_url(ctx), show_tree=tree_text))
