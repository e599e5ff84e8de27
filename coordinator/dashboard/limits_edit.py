"""A running context's limits changed from the dashboard (docs/dashboard.md): the API's
JSON body and the tree page's form made into ``Coordinator.set_limits`` arguments
(canonical decimals only: core/limit_text.py), the change audited under the operator's
name. Nothing changes when a value, the id or the context's state is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.limit_text import change_lines, count_from_text, usd_from_text
from ..models import TokenBudget
from ..models_limits import LimitsChange
from .quota_edit import actor_of
from .service import Service, UnknownTenantError

FIELDS = ("max_cost_usd", "max_steps", "max_retries_total", "token_budget")
"""The limits a body or form may give (``token_budget``: the total tokens)."""


def limits_from(fields: Mapping[str, object], *, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The limits given in a body or form as set_limits' keyword arguments (a null or blank
    one is left as it is); another field than FIELDS and ``also`` is a ValueError."""
    unknown = sorted(set(fields) - set(FIELDS) - set(also))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}: give {', '.join(FIELDS)} and reason")
    given = {k: v for k, v in fields.items() if k in FIELDS and v not in (None, "")}
    if not given:
        raise ValueError(f"nothing to change: give one of {', '.join(FIELDS)}")
    limits: dict[str, Any] = {}
    for name, value in given.items():
        if name == "max_cost_usd":
            limits[name] = usd_from_text(value, name)
        elif name == "token_budget":
            limits[name] = TokenBudget(total=count_from_text(value, name))
        else:
            limits[name] = count_from_text(value, name)
    return limits


def change_limits(svc: Service, tenant: str, ctx_id: str, limits: Mapping[str, Any],
                  reason: str, actor: str) -> LimitsChange:
    """Apply ``limits`` to the context ``ctx_id`` of ``tenant``, audited as ``actor``."""
    coord = svc.coordinators.get(tenant)
    if coord is None:
        raise UnknownTenantError(tenant)
    try:
        return coord.set_limits(ctx_id, **limits, actor=actor_of(actor), reason=reason)
    finally:
        svc.cache.clear()


def change_text(done: LimitsChange) -> str:
    """The tree page's message: ``ID: max_cost_usd $0.05 -> $0.10; lifted ...; by ...``."""
    return "; ".join(change_lines(done))
