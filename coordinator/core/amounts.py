"""Pure budget arithmetic: money in integer micro-USD, the dimensions a context limits and
a call reserves, and the reading of counters back into snapshot fields. No Redis here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidCostError
from ..models import (
    MAX_COUNT,
    MAX_USD,
    ExecutionConfig,
    TokenBudget,
    TokenTotals,
    WrapOptions,
    in_range,
)

MICRO = 1_000_000

# Token dimensions as limited in Redis, and the names users see. Only the directions are
# counted (u: used, h: held); a total is always their sum, so its limit (l:ttot,
# l:<provider>.ttot) is checked against tin + tout and no total counter is kept.
TOKEN_DIMS = {"ttot": "total", "tin": "input", "tout": "output"}
_FIELD_DIM = {v: k for k, v in TOKEN_DIMS.items()}


def check_cost(value: float | int | None, field: str = "cost_usd") -> None:
    """Raise :class:`InvalidCostError` unless ``value`` is None or a USD amount from 0 to
    MAX_USD (a real number: not a bool, a string, NaN or infinite)."""
    if value is not None and not in_range(value, 0, MAX_USD):
        raise InvalidCostError(field, value, MAX_USD)


def check_tokens(field: str, value: float | int | None) -> None:
    """Raise :class:`InvalidCostError` unless ``value`` is None or a whole number of tokens
    from 0 to MAX_COUNT."""
    if value is not None and not (in_range(value, 0, MAX_COUNT) and int(value) == value):
        raise InvalidCostError(field, value, MAX_COUNT, tokens=True)


def usd_to_micro(usd: float, *, round_up: bool = False) -> int:
    """USD as integer micro-USD. Estimates round up (conservative), actuals to nearest."""
    check_cost(usd)
    scaled = usd * MICRO
    return math.ceil(scaled - 1e-6) if round_up else int(round(scaled))


def micro_to_usd(micro: int) -> float:
    return micro / MICRO


def token_limit_dims(budget: TokenBudget | None) -> tuple[dict[str, int], list[str]]:
    """The token limits of a budget as {dimension: limit}, and the dimensions whose
    provider share was clamped by the budget's own limit in the same dimension."""
    if budget is None:
        return {}, []
    limits: dict[str, int] = {}
    clamped: list[str] = []
    for dim, field in TOKEN_DIMS.items():
        value = getattr(budget, field)
        if value is not None:
            limits[dim] = value
    for slug, share in (budget.provider_shares or {}).items():
        for dim, field in TOKEN_DIMS.items():
            value = getattr(share, field)
            if value is None:
                continue
            cap = limits.get(dim)
            if cap is not None and value > cap:
                value = cap
                clamped.append(f"{slug}.{field}")
            limits[f"{slug}.{dim}"] = value
    return limits, clamped


def open_triples(
    config: ExecutionConfig,
    *,
    is_child: bool,
    explicit: frozenset[str] = frozenset(),
) -> list[str | int]:
    """ARGV triples (dimension, mode, value) for open.lua.

    For a child, a field not in ``explicit`` is inherited: cost and tokens from what
    remains above, steps and retries from the parent's limits (the linking spec).
    """
    out: list[str | int] = []

    def add(dim: str, mode: str, value: int) -> None:
        out.extend((dim, mode, value))

    usd = usd_to_micro(config.max_cost_usd)
    if is_child and "max_cost_usd" not in explicit:
        add("usd", "remaining", 0)
    else:
        add("usd", "set", usd)
    for dim, name in (("steps", "max_steps"), ("retries", "max_retries_total")):
        value = int(getattr(config, name))
        add(dim, "parent" if is_child and name not in explicit else "set", value)
    tokens, _ = token_limit_dims(config.token_budget)
    for dim in TOKEN_DIMS:
        if dim in tokens:
            add(dim, "set", tokens[dim])
        elif is_child:
            add(dim, "remaining", 0)
    for dim, value in tokens.items():
        if dim not in TOKEN_DIMS:
            add(dim, "set", value)
    return out


def reserve_amounts(options: WrapOptions, floor_micro: int = 0) -> list[str | int]:
    """ARGV pairs (dimension, amount) that reserve.lua holds for one call.

    The worst case is held: the cost estimate (rounded up; at least ``floor_micro``),
    one step, the projected input tokens and the call's ``max_output_tokens``.
    """
    usd = max(usd_to_micro(options.cost_estimate_hint, round_up=True), floor_micro)
    pairs: list[str | int] = ["usd", usd, "steps", 1]
    return pairs + _token_pairs(options.input_tokens_estimate or 0,
                                options.max_output_tokens or 0, options.provider)


def actual_amounts(
    cost_micro: int, input_tokens: int, output_tokens: int, provider: str | None
) -> list[str | int]:
    """ARGV pairs (dimension, amount) of what a call actually spent."""
    pairs: list[str | int] = ["usd", cost_micro]
    return pairs + _token_pairs(input_tokens, output_tokens, provider)


def _token_pairs(tin: int, tout: int, provider: str | None) -> list[str | int]:
    """Token ARGV pairs: input then output, overall and for the provider (the scripts
    rely on each ``tin`` being followed by its ``tout``)."""
    if not (tin or tout):
        return []
    if not provider:
        return ["tin", tin, "tout", tout]
    return ["tin", tin, "tout", tout, f"{provider}.tin", tin, f"{provider}.tout", tout]


def held_amount(held: list[Any], dim: str) -> int:
    """The amount of ``dim`` in a flat [dim, amount, ...] list (0 if absent)."""
    for i in range(0, len(held), 2):
        if held[i] == dim:
            return int(held[i + 1])
    return 0


def _int(h: Mapping[str, str], field: str) -> int:
    return int(h.get(field) or 0)


def token_totals(h: Mapping[str, str]) -> TokenTotals:
    """Token counters of a context hash, with a breakdown per provider."""
    providers = sorted({f[2:].rsplit(".", 1)[0] for f in h
                        if f.startswith(("u:", "h:")) and "." in f})

    def totals(prefix: str) -> dict[str, Any]:
        tin, tout = _int(h, f"u:{prefix}tin"), _int(h, f"u:{prefix}tout")
        return {
            "input": tin,
            "output": tout,
            "total": tin + tout,
            "reserved": _int(h, f"h:{prefix}tin") + _int(h, f"h:{prefix}tout"),
        }

    return TokenTotals(
        **totals(""),
        by_provider={p: TokenTotals(**totals(f"{p}.")) for p in providers},
    )


def token_limits(h: Mapping[str, str]) -> dict[str, int]:
    """Effective token limits of a context hash, named ``total`` or ``openai.output``."""
    out: dict[str, int] = {}
    for field, value in h.items():
        if not field.startswith("l:"):
            continue
        dim = field[2:]
        slug, _, base = dim.rpartition(".")
        if base in TOKEN_DIMS:
            name = TOKEN_DIMS[base]
            out[f"{slug}.{name}" if slug else name] = int(value)
    return out


def remaining_tokens(hashes: Sequence[Mapping[str, str]]) -> dict[str, int]:
    """Remaining allowance per limited token dimension, the least over the given levels
    (a path's context hashes): limit - used - held."""
    out: dict[str, int] = {}
    for h in hashes:
        for name, limit in token_limits(h).items():
            slug, _, base = name.rpartition(".")
            prefix = f"{slug}." if slug else ""
            counted = ("tin", "tout") if base == "total" else (_FIELD_DIM[base],)
            taken = sum(_int(h, f"u:{prefix}{d}") + _int(h, f"h:{prefix}{d}")
                        for d in counted)
            left = max(0, limit - taken)
            out[name] = min(left, out.get(name, left))
    return out


def remaining_usd(hashes: Sequence[Mapping[str, str]]) -> float:
    """USD left under the tightest cost ceiling of a path."""
    left = [max(0, _int(h, "l:usd") - _int(h, "u:usd") - _int(h, "h:usd"))
            for h in hashes if "l:usd" in h]
    return micro_to_usd(min(left)) if left else 0.0


def remaining_usd_fraction(hashes: Sequence[Mapping[str, str]]) -> float | None:
    """What is left of the tightest cost ceiling of a path (the one with the least USD
    left, as in remaining_usd; of two with as little, the smaller fraction), as a
    fraction of that ceiling; None when no level has one."""
    left = [(max(0, _int(h, "l:usd") - _int(h, "u:usd") - _int(h, "h:usd")),
             _int(h, "l:usd")) for h in hashes if "l:usd" in h]
    if not left:
        return None
    return min((n, n / limit if limit else 0.0) for n, limit in left)[1]


def ms_to_datetime(ms: int) -> datetime | None:
    """A Redis-time millisecond stamp as an aware UTC datetime (0 = None)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc) if ms else None
