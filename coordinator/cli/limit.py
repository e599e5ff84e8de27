"""``budgetctl limit``: change a running context's limits (``Coordinator.set_limits``),
audited; a raise lifts the stop that limit caused, a lowering below the spend stops it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..core.limit_text import change_lines, count_from_text, usd_from_text
from ..errors import ContextClosedError, ContextNotFoundError, InvalidConfigError
from ..models import TokenBudget
from ._common import connect, fail, print_json
from .help_format import PlainCommand, PlainGroup
from .reads import locate

app = typer.Typer(cls=PlainGroup)


@app.command(cls=PlainCommand)
def limit(
    ctx: typer.Context,
    context_id: Annotated[str, typer.Argument(
        metavar="ID", help="A context id, or the start of an open tree's id.")],
    reason: Annotated[str, typer.Option(
        "--reason", metavar="TEXT", help="Why, kept in the limits_changed event.")],
    usd: Annotated[str | None, typer.Option(
        "--usd", metavar="DOLLARS", help="The new USD ceiling: a plain decimal (2.00).")] = None,
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="N", help="The new step limit.")] = None,
    retries: Annotated[str | None, typer.Option(
        "--retries", metavar="N", help="The new retry budget.")] = None,
    tokens: Annotated[str | None, typer.Option(
        "--tokens", metavar="N", help="The new total token limit (input + output).")] = None,
    actor: Annotated[str | None, typer.Option(
        "--actor", metavar="WHO", help="Who makes the change, for the audit (default: "
        "USER@HOST).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the change as JSON (shape: docs/cli.md).")] = False,
) -> None:
    """Raise or lower a running context's limits; a raise lifts the stop it caused."""
    if usd is steps is retries is tokens is None:
        fail("limit: nothing to change (give --usd, --steps, --retries or --tokens)", 2)
    try:  # every value is checked before Redis is asked
        max_cost_usd = None if usd is None else usd_from_text(usd, "--usd")
        max_steps = None if steps is None else count_from_text(steps, "--steps")
        max_retries = None if retries is None else count_from_text(retries, "--retries")
        token_budget = None if tokens is None else TokenBudget(
            total=count_from_text(tokens, "--tokens"))
    except ValueError as exc:  # a TokenBudget's InvalidConfigError included
        fail(str(exc), 2)
    with connect(ctx) as coord:
        try:
            where = locate(coord, context_id)
        except ContextNotFoundError as exc:  # bad input here: nothing to steer
            fail(str(exc), 2)
        try:
            done = coord.set_limits(where.ctx_id, max_cost_usd=max_cost_usd,
                                    max_steps=max_steps, max_retries_total=max_retries,
                                    token_budget=token_budget, actor=actor, reason=reason)
        except (InvalidConfigError, ContextClosedError) as exc:
            fail(str(exc), 2)
    if as_json:
        print_json(lambda: done.model_dump(mode="json"), None)
    else:
        sys.stdout.write("\n".join(change_lines(done)) + "\n")
