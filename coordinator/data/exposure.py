"""Exposure of context data to wrapped tools: ``current_data_view()`` returns a read-only
snapshot only when the context's (inherited) ExposurePolicy allows the running tool."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..context.call import active_call
from .context_data import ContextData, redis_call
from .model import ExposurePolicy


def freeze(value: Any) -> Any:
    """A read-only copy: maps become mapping proxies, lists tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def exposed_view(data: ContextData, operation: str, tags: tuple[str, ...]
                 ) -> Mapping[str, Any] | None:
    """What a tool with this operation id and tags may see of ``data``: the visible data
    narrowed by every level's ``expose_keys``, frozen; None unless the nearest policy
    allows the tool. The data is read only once the policy allowed it."""
    records = redis_call("data exposure", lambda: data.store.records(
        data.path, ["expose", "expose_keys"]))
    policy = next((ExposurePolicy.from_json(json.loads(r[0])) for r in records if r[0]),
                  None)
    if policy is None or not policy.allows(operation, tags):
        return None
    allowed: set[str] | None = None
    for rec in records:
        if rec[1]:
            keys = set(json.loads(rec[1]))
            allowed = keys if allowed is None else allowed & keys
    view = data.to_dict()
    if allowed is not None:
        view = {k: v for k, v in view.items() if k in allowed}
    frozen: Mapping[str, Any] = freeze(view)
    return frozen


def current_data_view() -> Mapping[str, Any] | None:
    """Inside a wrapped tool call: a read-only, sanitized snapshot of the data its context
    sees, if the exposure policy allows this tool (by operation id, prefix or declared
    tag), narrowed by ``expose_keys``. None outside a wrapped call and when not allowed
    (the default: no policy, no exposure)."""
    call = active_call.get()
    if call is None:
        return None
    state = call.state
    data = ContextData(state.coord, state.path, lambda: state.closed)
    return exposed_view(data, call.options.operation_name, call.options.tags)
