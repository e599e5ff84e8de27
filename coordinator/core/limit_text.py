"""A running context's new limits as an operator types them (``budgetctl limit``'s options,
the dashboard's ``PUT /api/trees/{id}/limits`` body and its tree page's form): canonical
decimals only, so one amount has one spelling. No sign, exponent, hex, separator, space,
NaN or infinity; dollars to the micro-dollar at most. The range (at least one micro-dollar
or one step, at most MAX_USD or MAX_COUNT) is the coordinator's check, not this one's.
Also what a change did, as both of them say it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models_limits import LimitsChange

_USD = re.compile(r"(?:0|[1-9][0-9]{0,9})(?:\.[0-9]{1,6})?")
_COUNT = re.compile(r"0|[1-9][0-9]{0,15}")

USD_HINT = "a plain decimal number of dollars such as 2.00 (at most 6 decimals)"
COUNT_HINT = "a plain whole number such as 100"


def _text_of(value: object, name: str) -> str:
    """``value`` as the text it was given as: a string as it is, a JSON number as Python
    writes it (``2.5``; ``1e+16`` and ``nan`` are then refused as any text would be)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    raise ValueError(f"{name} must be a number or a string of one, got {type(value).__name__}")


def usd_from_text(value: object, name: str = "max_cost_usd") -> float:
    """Dollars from ``2.00`` (or the JSON number 2.0). Raises ValueError naming ``name``."""
    text = _text_of(value, name)
    if not _USD.fullmatch(text):
        raise ValueError(f"{name}: {text[:40]!r} is not {USD_HINT}")
    return float(text)


def limit_text(limit: str, value: float | int | None) -> str:
    """A limit as a person reads it: ``$2.00`` for ``max_cost_usd`` (to the micro-dollar,
    at least two decimals), ``1,000`` for a count, ``none`` when there was none."""
    if value is None:
        return "none"
    if limit != "max_cost_usd":
        return f"{int(value):,}"
    whole, _, cents = f"{value:,.6f}".partition(".")
    return f"${whole}.{cents.rstrip('0').ljust(2, '0')}"


def count_from_text(value: object, name: str) -> int:
    """A count from ``100`` (or the JSON number 100). Raises ValueError naming ``name``."""
    text = _text_of(value, name)
    if not _COUNT.fullmatch(text):
        raise ValueError(f"{name}: {text[:40]!r} is not {COUNT_HINT}")
    return int(text)


def change_lines(done: LimitsChange) -> list[str]:
    """What changed (each limit before -> after), the context's state after it, who and
    why: the lines ``budgetctl limit`` prints (the dashboard's message joins them)."""
    changed = "; ".join(f"{c.limit} {limit_text(c.limit, c.before)} -> "
                        f"{limit_text(c.limit, c.after)}" for c in done.changes)
    if done.stopped:
        state = f"stopped: {done.stop_reason}"
    else:
        state = f"lifted {', '.join(done.lifted)}: running again" if done.lifted else "running"
    return [f"{done.ctx_id}: {changed}", state, f"by {done.actor}: {done.reason}"]
