"""``budgetctl demo``: runs coordinator.demo, imported only when the command runs (the
demo needs Celery, which the rest of budgetctl does not)."""

from __future__ import annotations

import typer

from ..errors import BackendConfigError, BackendUnavailableError, TopologySettingError
from ._common import fail, redis_url, unavailable_text
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(cls=PlainGroup)


@app.command(cls=PlainCommand)
def demo(ctx: typer.Context) -> None:
    """Sub-agents on two Celery workers under one ceiling, then an abort.

    Uses --redis (or the configured Redis) if it answers, else starts an embedded one
    (a --redis that does not answer exits 2)."""
    from ..demo import run_demo
    from .tree import tree_text

    url = redis_url(ctx)
    try:
        code = run_demo(url, show_tree=tree_text)
    except BackendUnavailableError as exc:
        fail(unavailable_text(url or "", exc), 2)
    except (BackendConfigError, TopologySettingError) as exc:
        fail(str(exc), 2)
    raise typer.Exit(code)
