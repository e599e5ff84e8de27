"""``budgetctl repair``: re-validate a context whose corrupt fields an operator fixed or
reset, lift its ``state_corrupt`` stop, and charge once what the corruption left held."""

from __future__ import annotations

from typing import Annotated

import typer

from ..runtime.actor import user_at_host
from ._common import connect
from .help_format import PlainCommand, PlainGroup
from .reads import locate

app = typer.Typer(cls=PlainGroup)


@app.command(cls=PlainCommand)
def repair(
    ctx: typer.Context,
    context_id: Annotated[str, typer.Argument(
        metavar="ID", help="A context id, or the start of an open tree's id.")],
) -> None:
    """Re-validate a context after its fields were fixed; lift its state_corrupt stop."""
    with connect(ctx) as coord:
        where = locate(coord, context_id)
        done = coord.repair(where.ctx_id, operator=f"budgetctl by {user_at_host()}")
        for name, (was, now) in sorted(done.holds.items()):
            print(f"{name}: {was} -> {now} (what the open reservations hold)")
        for rid in done.charged:
            print(f"charged the settle of {rid} that the corruption had stopped")
        if done.lifted:
            print(f"repaired {done.chain_id}: state_corrupt lifted, now {done.status}")
        else:
            print(f"{done.chain_id} is valid ({done.status}); no state_corrupt stop to lift")
