"""A call at the edge of its budget (docs/degrade.md): the terms its reserve carries to
reserve.lua (may it spend the final reserve; its model ladder, each rung with its worst
case), the model the reserve chose, and the calls ``ctx.finishing()`` marks final."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..core import pricing
from ..core.amounts import usd_to_micro
from ..core.charging_rules import ChargingPolicy
from ..errors import InvalidConfigError
from ..models import Degrade, WrapOptions
from ..models_degrade import to_ppm
from ..store.requests import PLAIN, EdgeTerms
from .state import ContextState

finishing_ids: ContextVar[tuple[str, ...]] = ContextVar("budget_finishing", default=())
"""The contexts whose calls run final here (``ctx.finishing()``): theirs and their
descendants'."""


@contextmanager
def finishing(ctx_id: str) -> Iterator[None]:
    """Mark every call of context ``ctx_id`` (and of its descendants) in the block final."""
    token = finishing_ids.set((*finishing_ids.get(), ctx_id))
    try:
        yield
    finally:
        finishing_ids.reset(token)


FINAL = EdgeTerms(final=True)
"""A final call without a ladder."""
TERMS_CACHED = 4096
"""The most terms kept (edge_terms); the cache starts over when full."""
_terms: dict[tuple[object, ...], tuple[int, Degrade, EdgeTerms]] = {}
"""Terms by (ladder's id, model, provider, token estimates, usd, floor, final): with the
price generation they were priced at and the ladder (an id is reused once freed)."""


def edge_terms(state: ContextState, opts: WrapOptions, usd: int, floor: int) -> EdgeTerms:
    """The terms of a call's reserve: final (``WrapOptions.final`` or in
    ``finishing()``), and the rungs of the model ladder its model heads, each with its
    worst case in micro-USD: the requested model's at least ``usd`` (what a plain
    reserve holds), every rung's at least ``floor``; priced at the call's input estimate
    and ``max_output_tokens``, once per price generation (pricing.generation: set_price,
    clear_prices and load_price_table change it)."""
    final = opts.final or any(i in state.path.ids for i in finishing_ids.get())
    degrade = state.config.degrade
    if degrade is None:
        return FINAL if final else PLAIN
    key = (id(degrade), opts.model, opts.provider, opts.input_tokens_estimate,
           opts.max_output_tokens, usd, floor, final)
    generation = pricing.generation()
    hit = _terms.get(key)
    if hit is not None and hit[0] == generation and hit[1] is degrade:
        return hit[2]
    terms = _priced(degrade, opts, usd, floor, final)
    if len(_terms) >= TERMS_CACHED:
        _terms.clear()
    _terms[key] = (generation, degrade, terms)
    return terms


def _priced(degrade: Degrade, opts: WrapOptions, usd: int, floor: int, final: bool
            ) -> EdgeTerms:
    models = degrade.rungs(opts.model)
    if not models:
        return FINAL if final else PLAIN
    rungs: list[str | int] = []
    for i, model in enumerate(models):
        rungs += [model, max(usd if i == 0 else floor, worst_case(model, opts))]
    return EdgeTerms(final, tuple(rungs), to_ppm(degrade.below))


def worst_case(model: str, opts: WrapOptions) -> int:
    """What a call on ``model`` costs at most, in micro-USD: its price at the input
    estimate and ``max_output_tokens`` (0 when the model has no price)."""
    usd = pricing.price_usd(model, opts.input_tokens_estimate or 0,
                            opts.max_output_tokens or 0, provider=opts.provider)
    return usd_to_micro(usd, round_up=True) if usd else 0


def chosen_rung(terms: EdgeTerms, rung: int) -> tuple[str, int] | None:
    """The model and worst case of rung ``rung`` (reserve.lua's reply, from 1), or None
    when the call named no ladder."""
    if rung <= 0 or not terms.rungs:
        return None
    model, amount = terms.rungs[2 * rung - 2], terms.rungs[2 * rung - 1]
    return str(model), int(amount)


def check_ladder(degrade: Degrade, charging: ChargingPolicy) -> None:
    """Refuse a ladder naming a model without a price (InvalidConfigError): every
    fallback must be priced for its worst case to be known, and under
    ``pricing="strict"`` the requested models too."""
    problems = []
    for model, fallbacks in degrade.ladder.items():
        named = (model, *fallbacks) if charging.pricing == "strict" else fallbacks
        for rung in named:
            if pricing.model_price(rung) is None:
                problems.append({"loc": ("ladder", model), "input": rung,
                                 "msg": f"model {rung!r} has no price: set_price() it "
                                        f"first"})
    if problems:
        raise InvalidConfigError("Degrade", problems)
