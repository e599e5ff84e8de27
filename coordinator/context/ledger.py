"""TokenLedger: explicit token reservations on a context, for code that meters tokens
outside a wrapped call (the Limits specification's ledger). It runs on the same scripts
as wrapped calls: a reservation holds tokens at every level of the tree, ``consume``
reconciles it with the actual usage, ``rollback`` drops it."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from ..core.amounts import actual_amounts, check_tokens
from ..core.usage import check_names
from ..errors import InvalidUsageError
from ..models import TokenTotals
from ..quotas.steps import grant_short, refill_and_reserve
from ..store.requests import Reserve
from ..store.tree import Refused
from .executor import Executor
from .reading import limit_error, snapshot
from .state import ContextState
from .steps import drive


@dataclass(frozen=True)
class LedgerReservation:
    """Tokens held before a call."""

    reservation_id: str
    input_tokens: int
    output_tokens: int
    provider: str | None
    direction: Literal["input", "output", "both"]
    chain_id: str = ""
    """The context whose ledger holds it (only that ledger can consume or roll it back)."""


class TokenLedger:
    """Token reservations and consumption of one context, rolled up its whole tree.

    After each mutation a ``TokenLedgerUpdated`` event goes to the tree's ledger stream and
    the ledger pub/sub channel (consumption is published by the settle script itself).
    """

    def __init__(self, state: ContextState) -> None:
        self._state = state

    def reserve(self, *, input_tokens: int = 0, output_tokens: int = 0,
                provider: str | None = None) -> LedgerReservation:
        """Hold tokens at every level (and in the tree's quota grants, topped up as a
        call's are), or raise ``PromptEvaluationError`` (phase ``token_budget``,
        ``deadline`` or ``halted``; reason ``quota_exceeded`` for a quota) when any
        allowance would be exceeded."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            check_tokens(name, value)
        check_names(provider, None)
        reservation_id = secrets.token_hex(16)
        amounts = actual_amounts(0, input_tokens, output_tokens, provider)[2:]
        state = self._state
        res = state.store.reserve(state.path, reservation_id, amounts)
        if isinstance(res, Refused) and grant_short(res):  # a quota grant to top up
            res = drive(refill_and_reserve(
                Reserve(state.path, reservation_id, amounts, False), res), Executor(state))
        if isinstance(res, Refused):
            raise limit_error(state, res.reason, res.detail)
        direction: Literal["input", "output", "both"] = (
            "both" if input_tokens and output_tokens else "input" if input_tokens else "output")
        reservation = LedgerReservation(reservation_id, input_tokens, output_tokens,
                                        provider, direction, state.ctx_id)
        self._publish("reserved", reservation)
        return reservation

    def consume(self, reservation: LedgerReservation, *, input_tokens: int = 0,
                output_tokens: int = 0) -> None:
        """Replace a reservation with the actual usage (idempotent)."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            check_tokens(name, value)
        self._check_own(reservation)
        self._finish(reservation, actual_amounts(
            0, input_tokens, output_tokens, reservation.provider)[2:])

    def rollback(self, reservation: LedgerReservation) -> None:
        """Drop a reservation whose call failed (idempotent)."""
        self._check_own(reservation)
        self._finish(reservation, [])
        self._publish("rolled_back", reservation)

    def _check_own(self, reservation: LedgerReservation) -> None:
        """Raise InvalidUsageError unless ``reservation`` was made by this context's ledger
        (the settle rolls back holds along the path it is given)."""
        if not isinstance(reservation, LedgerReservation) or (
                reservation.chain_id != self._state.ctx_id):
            raise InvalidUsageError(f"{reservation!r} is not a reservation of the ledger of "
                                    f"context {self._state.ctx_id}")

    def _finish(self, reservation: LedgerReservation, amounts: list[str | int]) -> None:
        """Settle a reservation at ``amounts`` without counting a step or a retry."""
        self._state.store.finish(self._state.path, reservation.reservation_id,
                                 outcome="skip", node=None, amounts=amounts,
                                 write_behind=False)

    def totals(self) -> TokenTotals:
        """Consumed and reserved tokens of the context, subtree included."""
        return snapshot(self._state).tokens

    def _publish(self, change: str, r: LedgerReservation) -> None:
        state = self._state
        event = json.dumps({
            "type": "TokenLedgerUpdated", "chain_id": state.ctx_id, "root": state.path.root,
            "change": change, "direction": r.direction,
            "reserved": {r.provider or "": {"input": r.input_tokens,
                                             "output": r.output_tokens}},
            "ts": int(time.time() * 1000),
        })
        state.store.publish_ledger(state.path, event)
