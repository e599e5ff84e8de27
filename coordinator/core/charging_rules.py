"""What a call that ran is charged, whatever it reported: the rule of docs/tokens.md
("What a call is charged"), pure. A valid report is charged as reported (tokens priced);
an invalid report, tokens of a model with no price, or no report at all never make a
call free: they fall back to its estimate, a fallback price per token, or a floor."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidConfigError
from ..models import MAX_USD, check_usd
from . import pricing
from .amounts import usd_to_micro
from .usage import Usage

DEFAULT_FLOOR_USD = 0.0001
"""What an LLM call that reported nothing and reserved no estimate is charged ($0.0001)."""

Ended = Literal["returned", "raised", "cancelled"]


@dataclass(frozen=True)
class ChargingPolicy:
    """How calls whose spend is not known are charged (``Coordinator(charging=...)``)."""

    pricing: Literal["estimate", "strict"] = "estimate"
    """``strict``: refuse, before it runs, a call whose ``WrapOptions.model`` has no price;
    ``estimate``: run it, and charge unpriced tokens by the rule."""
    unpriced_usd_per_token: float | None = None
    """USD per token (input and output alike) for tokens of a model with no price; None:
    such tokens are charged the call's estimate (at least the floor)."""
    floor_usd: float = DEFAULT_FLOOR_USD
    """The least a call is charged when its report is invalid or unpriced, or when an LLM
    call reports nothing and reserved no estimate (0 makes such calls free)."""

    @functools.cached_property
    def floor_micro(self) -> int:
        """The floor in micro-USD (what an LLM call without an estimate holds); computed
        once (it is read on every call's charge)."""
        return usd_to_micro(self.floor_usd)

    def __post_init__(self) -> None:
        problems = []
        if self.pricing not in ("estimate", "strict"):
            problems.append({"loc": ("pricing",), "msg": "must be 'estimate' or 'strict'",
                             "input": self.pricing})
        for name in ("unpriced_usd_per_token", "floor_usd"):
            value = getattr(self, name)
            if value is None and name == "unpriced_usd_per_token":
                continue
            try:
                check_usd(value, name)
            except ValueError as exc:
                problems.append({"loc": (name,), "msg": str(exc), "input": value})
        if problems:
            raise InvalidConfigError("ChargingPolicy", problems)


@dataclass(frozen=True)
class Charge:
    """What one call is charged, and by which rule (``charged_by`` on its node)."""

    cost: int
    """Micro-USD."""
    tin: int
    tout: int
    provider: str | None
    rule: str
    """``reported``, ``priced``, ``estimate``, ``floor``, ``fallback_price``, ``none``."""
    unpriced_model: str | None = None
    """The model whose tokens had no price (its ``usage_unpriced`` event names it)."""
    unreported: bool = False
    """An LLM call that returned with no report and no estimate (charged the floor)."""


def charge(held: dict[str, int], estimate: int, usage: Usage | None, *, kind: str,
           ended: Ended, invalid: bool, model: str | None, provider: str | None,
           policy: ChargingPolicy) -> Charge:
    """The charge of a call that ran. ``held`` is its reservation (dimension -> amount;
    its tokens are the token estimates), ``estimate`` its cost estimate in micro-USD,
    ``usage`` its valid report (or what its response carried), ``invalid`` whether a
    report was refused, ``ended`` how its function ended."""
    if not invalid:
        return _valid(held, estimate, usage, kind=kind, ended=ended, model=model,
                      provider=provider, policy=policy)
    # billed for an unknown amount: the estimate, at least the floor, never less than
    # what was validly reported besides
    valid = _valid(held, estimate, usage, kind=kind, ended="raised", model=model,
                   provider=provider, policy=policy)
    est, floor = estimate, policy.floor_micro
    cost = max(valid.cost, est, floor)
    rule = valid.rule if cost == valid.cost else "estimate" if cost == est else "floor"
    return Charge(cost, max(valid.tin, held.get("tin", 0)), max(valid.tout, held.get("tout", 0)),
                  valid.provider, rule, unpriced_model=valid.unpriced_model)


def _valid(held: dict[str, int], est: int, usage: Usage | None, *, kind: str, ended: Ended,
           model: str | None, provider: str | None, policy: ChargingPolicy) -> Charge:
    """The charge of a call whose reports were all valid."""
    floor = policy.floor_micro
    est_tin, est_tout = held.get("tin", 0), held.get("tout", 0)
    provider = (usage.provider if usage else None) or provider
    reported = usage is not None and (usage.cost_usd is not None or usage.has_tokens)
    if usage is None or not reported:
        if ended == "raised":  # a failed request is not billed
            return Charge(0, 0, 0, provider, "none")
        if ended == "returned" and kind == "llm" and est == 0:
            return Charge(floor, est_tin, est_tout, provider, "floor", unreported=True)
        return Charge(est, est_tin, est_tout, provider, "estimate")
    tin, tout = (usage.input_tokens, usage.output_tokens) if usage.has_tokens else (
        (0, 0) if ended == "raised" else (est_tin, est_tout))
    if usage.cost_usd is not None:
        return Charge(usd_to_micro(usage.cost_usd), tin, tout, provider, "reported")
    named = usage.model or model
    priced = pricing.price_usd(
        named, tin, tout, cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens, provider=provider)
    if priced is not None:  # (tokens in range may still price beyond any ceiling)
        return Charge(usd_to_micro(min(priced, MAX_USD)), tin, tout, provider, "priced")
    unpriced = named or "(no model)"
    if policy.unpriced_usd_per_token is not None:
        cost = max(usd_to_micro(min((tin + tout) * policy.unpriced_usd_per_token, MAX_USD)),
                   floor)
        return Charge(cost, tin, tout, provider, "fallback_price", unpriced_model=unpriced)
    cost = max(est, floor)
    return Charge(cost, tin, tout, provider, "floor" if cost > est else "estimate",
                  unpriced_model=unpriced)


def strict_refusal(model: str | None, provider: str | None,
                   policy: ChargingPolicy) -> str | None:
    """Why ``pricing="strict"`` refuses a call naming ``model`` (None: it may run)."""
    if policy.pricing != "strict" or model is None:
        return None
    if pricing.model_price(model, provider) is not None:
        return None
    return f"model {model!r} has no price (pricing='strict'): set_price() it first"
