"""``budgetctl abort``: stop a context and its subtree, on every machine."""

from __future__ import annotations

from typing import Annotated

import typer

from ..core.paths import Path
from ..core.vocabulary import StopReason
from ..errors import ContextNotFoundError
from ..runtime.actor import user_at_host
from ._common import connect
from .help_format import PlainCommand, PlainGroup
from .reads import locate

app = typer.Typer(cls=PlainGroup)

MAX_REASON = 1000
"""Characters of the reason kept (as ExecutionContext.abort keeps them)."""


@app.command(cls=PlainCommand)
def abort(
    ctx: typer.Context,
    context_id: Annotated[str, typer.Argument(
        metavar="ID", help="A context id, or the start of an open tree's id.")],
    reason: Annotated[list[str] | None, typer.Argument(
        metavar="REASON",
        help="The rest of the line, quoted or not, kept as the stop's detail; `tree` shows "
             "it under the stopped context. Default: 'aborted with budgetctl by "
             "USER@HOST'.")] = None,
) -> None:
    """Stop a context and its whole subtree, durably, in every process."""
    said = " ".join(reason or []).strip()
    text = (said or f"aborted with budgetctl by {user_at_host()}")[:MAX_REASON]
    with connect(ctx) as coord:
        where = locate(coord, context_id)
        reply = coord.store.abort(Path(where.root, where.ids), StopReason.ABORTED, text)
        if reply.outcome == "missing":
            raise ContextNotFoundError(where.ctx_id)
        if reply.outcome == "stopped":
            print(f"aborted {where.ctx_id} and its subtree: {text}")
        else:
            print(f"{where.ctx_id} was already {reply.status or 'stopped'}; nothing changed")
