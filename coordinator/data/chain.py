"""The causal chain: StepStarted, StepCompleted / StepFailed and CapabilityCall events on
the tree's chain stream (``bc:{R}:chain``, apart from the contexts' SafetyEvents, as the
specification keeps execution data apart from the chain). Only digests and sizes of tool
arguments and results are recorded, never the data itself."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.paths import Path
from ..errors import BackendUnavailableError
from ..models import ChainMetadata, Decision, SafetyEvent
from ..store.data import DataStore
from ..store.errors import UNAVAILABLE

if TYPE_CHECKING:
    from ..runtime.coordinator import Coordinator

HOOK = "CausalChain"
log = logging.getLogger("coordinator.data")


@dataclass
class _Step:
    name: str
    failure: str | None = None


_steps: weakref.WeakKeyDictionary[Any, _Step] = weakref.WeakKeyDictionary()


def digest(value: Any) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a value's canonical form: bytes as they are, JSON
    where it is JSON, else its repr."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        try:
            raw = json.dumps(value, sort_keys=True, separators=(",", ":"),
                             default=repr).encode()
        except (TypeError, ValueError):
            raw = repr(value).encode(errors="replace")
    return hashlib.sha256(raw).hexdigest(), len(raw)


def _linkage(meta: ChainMetadata) -> dict[str, Any]:
    return {"plan_id": meta.plan_id, "intent_ids": list(meta.intent_ids),
            "parent_action_id": meta.parent_action_id}


def _emit(coord: Coordinator, path: Path, meta: ChainMetadata, event_type: str,
          reason: str, decision: Decision = Decision.ALLOW, **fields: Any) -> None:
    """Queue one chain event. Never raises: the chain is a record, and the calls it
    records (and their settles) must go on whatever happens to it."""
    try:
        _queue(coord, path, meta, event_type, reason, decision, fields)
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("could not record %s for %s", event_type, path.ctx_id, exc_info=True)


def _queue(coord: Coordinator, path: Path, meta: ChainMetadata, event_type: str,
           reason: str, decision: Decision, fields: dict[str, Any]) -> None:
    event_json = _event_json(path, meta, event_type, reason, decision, fields)
    DataStore(coord.store).queue_chain_event(path.root, event_json)
    coord.schedule_flush()


def _event_json(path: Path, meta: ChainMetadata, event_type: str, reason: str,
                decision: Decision, fields: dict[str, Any]) -> str:
    event = SafetyEvent(event_type=event_type, decision=decision, reason=reason, hook=HOOK,
                        request_id=meta.request_id,
                        metadata={"chain_id": path.ctx_id, "step_id": path.ctx_id,
                                  "parent_chain_id": path.parent_id, **_linkage(meta),
                                  **fields})
    return event.model_dump_json()


def read_chain(coord: Coordinator, root_id: str, chain_id: str | None = None
               ) -> list[SafetyEvent]:
    """The causal chain of a tree, oldest first (only ``chain_id``'s events if given),
    after this process's queued writes."""
    try:
        raw = DataStore(coord.store).read_chain(root_id)
    except UNAVAILABLE as exc:
        raise BackendUnavailableError("read chain", exc) from exc
    events = [SafetyEvent.model_validate_json(text) for text in raw]
    return [e for e in events if chain_id is None or e.metadata.get("chain_id") == chain_id]


def step_started(ctx: Any, coord: Coordinator, path: Path, meta: ChainMetadata,
                 step_name: str, **fields: Any) -> None:
    """Record that the step ``ctx`` opened (it rides the next round trip)."""
    _steps[ctx] = _Step(step_name)
    _emit(coord, path, meta, "StepStarted", f"step {step_name!r} started",
          step_name=step_name, **fields)


def step_failed(ctx: Any, error: BaseException | None) -> None:
    """Note that the step ``ctx`` ends with ``error`` (its close records StepFailed);
    nothing when ``error`` is None."""
    step = _steps.get(ctx) if error is not None else None
    if step is not None and step.failure is None:
        step.failure = f"{type(error).__name__}: {error}"[:1000]


def step_closed(ctx: Any, coord: Coordinator, path: Path, meta: ChainMetadata) -> None:
    """Record StepCompleted or StepFailed for a step this process opened (once)."""
    step = _steps.pop(ctx, None)
    if step is None:
        return
    if step.failure is None:
        _emit(coord, path, meta, "StepCompleted", f"step {step.name!r} completed",
              step_name=step.name)
    else:
        _emit(coord, path, meta, "StepFailed", f"step {step.name!r} failed: {step.failure}",
              Decision.HALT, step_name=step.name, error=step.failure)


def capability_event(path: Path, meta: ChainMetadata, *, operation: str, node_id: str,
                     fn: Any, result: Any = None, error: BaseException | None = None
                     ) -> str | None:
    """The CapabilityCall event (JSON) of one wrapped tool call, for the tree's chain
    stream (``DataStore.queue_chain_event``): its operation, and the digest and size of
    its arguments (those of a ``functools.partial``; a closure's are not visible) and of
    its result. None when it cannot be built (the call goes on unrecorded)."""
    fields: dict[str, Any] = {"operation": operation, "node_id": node_id}
    try:
        args: Any = None
        if isinstance(fn, functools.partial):
            args = {"args": list(fn.args), "kwargs": dict(fn.keywords)}
        fields["args_digest"], fields["args_size"] = (digest(args) if args is not None
                                                      else (None, 0))
        if error is None:
            fields["result_digest"], fields["result_size"] = digest(result)
    except Exception:  # noqa: BLE001 - a repr that raises: the call is still recorded
        log.warning("could not digest the call %s", node_id, exc_info=True)
    if error is None:
        reason = f"capability {operation!r} returned"
    else:
        fields["error"] = type(error).__name__
        reason = f"capability {operation!r} raised {type(error).__name__}"
    try:
        return _event_json(path, meta, "CapabilityCall", reason,
                           Decision.ALLOW if error is None else Decision.RETRY, fields)
    except Exception:  # noqa: BLE001 - the chain is a record: the call goes on
        log.warning("could not record CapabilityCall for %s", path.ctx_id, exc_info=True)
        return None
