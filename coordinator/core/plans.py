"""What opening a context sends to Redis besides its identity, built once per config.

Every run of a ``@contained`` task, and every child spawned alike, opens with the same
config: its JSON record, deadline and open.lua triples are computed once and cached
(when the config is hashable; a child's plan is not cached when it has a deadline, which
is checked against the clock when the config is built)."""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from ..models import ChainMetadata, ExecutionConfig, LeasePolicy, TokenBudget
from ..models_degrade import to_ppm
from .amounts import open_triples, token_limit_dims, usd_to_micro


@dataclass(frozen=True)
class OpenPlan:
    """What opening a context with ``config`` sends to Redis besides its identity."""

    config: ExecutionConfig
    config_json: str
    """What of the config the hash's other fields do not hold (the effective limits are
    ``l:usd``, ``l:steps``, ``l:retries`` and the token ``l:`` fields, the deadline
    ``deadline``): the settings that differ from the defaults, such as the timeout and
    the lease policy, and the dimensions clamped to what the ancestors had left. Compact,
    so that the hash's values stay under Redis' 64-byte listpack limit."""
    deadline_ms: int
    triples: tuple[str | int, ...]
    """open.lua's (dimension, mode, value) triples."""
    fields: tuple[str | int, ...] = ()
    """Hash fields the scripts read besides the limits (field, value, ...): ``fr``, the
    final reserve in micro-USD (reserve.lua), and ``wa``, the warning thresholds in
    parts per million, comma-separated (lib/warnings.lua)."""


_ALL_FIELDS = frozenset(ExecutionConfig.model_fields)
# The limits of a parent known only by its token: a child's open reads the real ones.
PLACEHOLDER_CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=1, max_retries_total=1)


@functools.lru_cache(maxsize=1024)
def placeholder_metadata(ctx_id: str) -> ChainMetadata:
    """The metadata of a parent known only by its token: its id and a request id of its
    own, shared by the children spawned from it here (as spawn_child's share theirs)."""
    return ChainMetadata(request_id=uuid.uuid4().hex, chain_id=ctx_id)


def open_plan(config: ExecutionConfig, *, is_child: bool,
               explicit: frozenset[str] = _ALL_FIELDS) -> OpenPlan:
    """The plan of opening with ``config``: the same for every context opened alike (each
    run of a ``@contained`` task), so it is cached when ``config`` is hashable."""
    try:
        return _cached_open_plan(config, is_child, explicit)
    except TypeError:  # unhashable: a token budget with provider shares
        return _build_open_plan(config, is_child, explicit)


_IN_OWN_FIELDS = {"max_cost_usd", "max_steps", "max_retries_total", "deadline", "token_budget"}


def _build_open_plan(config: ExecutionConfig, is_child: bool, explicit: frozenset[str]
                     ) -> OpenPlan:
    _, clamped = token_limit_dims(config.token_budget)
    return OpenPlan(
        config=config,
        config_json=json.dumps({**config.model_dump(mode="json", exclude_defaults=True,
                                                    exclude=_IN_OWN_FIELDS),
                                **({"clamped": clamped} if clamped else {})},
                               separators=(",", ":")),
        deadline_ms=int(config.deadline.timestamp() * 1000) if config.deadline else 0,
        triples=tuple(open_triples(config, is_child=is_child, explicit=explicit)),
        fields=edge_fields(config),
    )


def edge_fields(config: ExecutionConfig) -> tuple[str | int, ...]:
    """The hash fields of ``config``'s final reserve and warning thresholds (OpenPlan)."""
    fields: list[str | int] = []
    if config.final_reserve_usd:
        fields += ["fr", usd_to_micro(config.final_reserve_usd)]
    if config.warn_at:
        fields += ["wa", ",".join(str(to_ppm(t)) for t in config.warn_at)]
    return tuple(fields)


_cached_open_plan = functools.lru_cache(maxsize=256)(_build_open_plan)


def child_plan(parent: ExecutionConfig, max_cost_usd: float | None, max_steps: int | None,
                max_retries_total: int | None, timeout_ms: int,
                token_budget: TokenBudget | None, deadline: datetime | None,
                lease: LeasePolicy | bool | None = None) -> OpenPlan:
    """The plan of opening a child of a context configured ``parent`` (see spawn_child),
    cached like :func:`open_plan` unless a deadline is given (it is checked against the
    clock). ``lease``: None inherits the parent's lease policy, False opts out."""
    if lease is not None and not isinstance(lease, (bool, LeasePolicy)):
        raise TypeError(f"lease must be a LeasePolicy, False or None; got {lease!r}")
    args = (parent, max_cost_usd, max_steps, max_retries_total, timeout_ms, token_budget,
            lease)
    if deadline is None:
        try:
            return _cached_child_plan(*args, None)
        except TypeError:  # unhashable
            pass
    return _build_child_plan(*args, deadline)


def _build_child_plan(parent: ExecutionConfig, max_cost_usd: float | None,
                      max_steps: int | None, max_retries_total: int | None, timeout_ms: int,
                      token_budget: TokenBudget | None, lease: LeasePolicy | bool | None,
                      deadline: datetime | None) -> OpenPlan:
    given = {
        "max_cost_usd": max_cost_usd, "max_steps": max_steps,
        "max_retries_total": max_retries_total, "token_budget": token_budget,
        "deadline": deadline,
    }
    config = ExecutionConfig(
        max_cost_usd=max_cost_usd if max_cost_usd is not None else parent.max_cost_usd,
        max_steps=max_steps if max_steps is not None else parent.max_steps,
        max_retries_total=(max_retries_total if max_retries_total is not None
                           else parent.max_retries_total),
        timeout_ms=timeout_ms,
        token_budget=token_budget,
        deadline=deadline,
        lease=(parent.lease if lease is None or lease is True
               else lease if isinstance(lease, LeasePolicy) else None),
        approval_wait_s=parent.approval_wait_s,
        degrade=parent.degrade,
    )
    explicit = frozenset(k for k, v in given.items() if v is not None)
    return _build_open_plan(config, True, explicit)


# typed: True, 1 and 1.0 are equal keys, but only some of them are valid limits
_cached_child_plan = functools.lru_cache(maxsize=256, typed=True)(_build_child_plan)
