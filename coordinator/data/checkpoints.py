"""Checkpoints, serialization and resume: the data stack a context sees, as JSON, and a
new tree rebuilt from it. Budgets are not part of it: a resumed tree has the limits of
the config it is resumed with."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..core.paths import Path
from ..runtime.coordinator import Coordinator
from ..store.data import DataRefused, DataStore, LevelRecord
from .context_data import ContextData, redis_call, refusal
from .errors import CheckpointNotFoundError, InvalidCheckpointError
from .model import IsolationLevel, StepMetadata
from .values import decode_value, encode_value


class DataLevel(Protocol):
    """A context handle as a restore builds the stack with it (an ExecutionContext)."""

    @property
    def data(self) -> ContextData: ...

    def spawn_child(self) -> Any: ...

    def close(self) -> None: ...


H = TypeVar("H", bound=DataLevel)

FORMAT = 1
_ID = re.compile(r"^[^\s,{}]{1,128}$")


def check_checkpoint_id(checkpoint_id: object) -> str:
    """``checkpoint_id`` if usable: 1-128 characters, no spaces, commas or braces."""
    if not isinstance(checkpoint_id, str) or not _ID.match(checkpoint_id):
        raise InvalidCheckpointError(f"checkpoint id must be 1-128 characters without "
                                     f"spaces , {{ }}; got {checkpoint_id!r}")
    return checkpoint_id


def _level_json(level: LevelRecord, checkpoint_id: str | None) -> dict[str, Any]:
    rec = level.record
    try:
        tags = dict(json.loads(level.meta_json).get("tags") or {})
    except (ValueError, AttributeError):
        tags = {}
    meta = StepMetadata(
        step_id=level.ctx_id, created_at=level.created_ms / 1000,
        step_name=rec.get("step") or None,
        checkpoint_id=checkpoint_id if checkpoint_id is not None else rec.get("cp"),
        is_parallel=rec.get("par") == "1",
        isolation_level=IsolationLevel.of(rec.get("iso") or "inherit"), tags=tags)
    isolated = meta.isolation_level is IsolationLevel.ISOLATED
    return {"metadata": meta.to_json(),
            "data": {k: decode_value(v) for k, v in sorted(level.data.items())},
            "view": ({k: decode_value(v) for k, v in sorted(level.view.items())}
                     if isolated else None)}


def stack_of(coord: Coordinator, path: Path, checkpoint_id: str | None = None
             ) -> dict[str, Any]:
    """The data stack ``path`` sees (read atomically), root-most level first."""
    levels = redis_call("data snapshot", lambda: DataStore(coord.store).snapshot(path))
    stack = [_level_json(lv, checkpoint_id if lv.ctx_id == path.ctx_id else None)
             for lv in reversed(levels)]
    return {"format": FORMAT, "checkpoint_id": checkpoint_id, "root_id": path.root,
            "chain_id": path.ctx_id, "taken_at": time.time(), "stack": stack}


def take_checkpoint(coord: Coordinator, path: Path, checkpoint_id: str) -> dict[str, Any]:
    """Record the data stack the context sees under ``checkpoint_id`` (in its tree, found
    by id from any process until its retention ends) and mark the context with it.
    Taking the same id again replaces it. Returns the record."""
    check_checkpoint_id(checkpoint_id)
    record = stack_of(coord, path, checkpoint_id)
    redis_call("checkpoint", lambda: DataStore(coord.store).save_checkpoint(
        path, checkpoint_id, json.dumps(record, separators=(",", ":")), coord.retention_s))
    return record


def serialize(coord: Coordinator, path: Path) -> str:
    """The data stack the context sees, with each level's metadata, as JSON."""
    return json.dumps(stack_of(coord, path), separators=(",", ":"))


def load_checkpoint(coord: Coordinator, checkpoint_id: str, root_id: str | None = None
                    ) -> dict[str, Any]:
    """A recorded checkpoint (``root_id`` finds it after its locator expired)."""
    check_checkpoint_id(checkpoint_id)
    text = redis_call("load checkpoint",
                  lambda: DataStore(coord.store).load_checkpoint(checkpoint_id, root_id))
    if text is None:
        raise CheckpointNotFoundError(checkpoint_id)
    record: dict[str, Any] = json.loads(text)
    return record


def _levels(document: object) -> list[tuple[StepMetadata, dict[str, Any], dict[str, Any]]]:
    """The checked levels of a serialized stack: (metadata, data, view)."""
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise InvalidCheckpointError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise InvalidCheckpointError(f"not a format-{FORMAT} data stack")
    stack = document.get("stack")
    if not isinstance(stack, list) or not stack:
        raise InvalidCheckpointError("the stack is empty or not a list")
    out = []
    for level in stack:
        try:
            meta = StepMetadata.from_json(level["metadata"])
            data, view = dict(level["data"]), dict(level.get("view") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidCheckpointError(f"bad level: {exc!r}") from None
        out.append((meta, data, view))
    return out


def restore(document: object, open_root: Callable[[], H]) -> H:
    """A new tree whose data is the serialized stack's: a new root from ``open_root``
    (``ExecutionContext.deserialize`` opens it with the config given), a child per
    further level with its isolation level, step name and (isolated) frozen view.
    Returns the deepest context; the ones above are its ``parent`` chain (close them
    after it). Budgets start afresh."""
    levels = _levels(document)
    ctx = open_root()
    ctx_chain = [ctx]
    try:
        for i, (meta, data, view) in enumerate(levels):
            if i > 0:
                ctx = ctx.spawn_child()
                ctx_chain.append(ctx)
            _restore_level(ctx.data, meta, data, view)
    except BaseException:
        for c in reversed(ctx_chain):
            c.close()
        raise
    return ctx


def _restore_level(cd: ContextData, meta: StepMetadata, data: dict[str, Any],
                   view: dict[str, Any]) -> None:
    limits = cd.limits
    encoded_view = ({k: encode_value(k, v, limits) for k, v in view.items()}
                    if meta.isolation_level is IsolationLevel.ISOLATED else None)
    ds, path = cd.store, cd.path
    reply = redis_call("resume", lambda: ds.spawn(path, meta.isolation_level.value,
                                                  is_parallel=meta.is_parallel,
                                                  step_name=meta.step_name or "",
                                                  view=encoded_view))
    if isinstance(reply, DataRefused):
        raise refusal(path.ctx_id, reply, limits)
    cd.update(data)


def resume(checkpoint_id: str, open_root: Callable[[Coordinator], H], *,
           coordinator: Coordinator | None = None, root_id: str | None = None) -> H:
    """A new tree rebuilt from a recorded checkpoint (see :func:`restore`);
    ``open_root`` opens its root on the coordinator (the default one unless given)."""
    coord = coordinator or Coordinator.default()
    record = load_checkpoint(coord, checkpoint_id, root_id)
    return restore(record, lambda: open_root(coord))


class Checkpointer:
    """Periodic checkpoints of one context under one id (the latest wins), every
    ``interval_ms`` on the coordinator's timer thread, until the context is closed."""

    def __init__(self, data: ContextData, checkpoint_id: str, interval_ms: int) -> None:
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or not (
                10 <= interval_ms <= 86_400_000):
            raise ValueError(f"interval_ms must be an int from 10 to 86400000; "
                             f"got {interval_ms!r}")
        self.data = data
        self.checkpoint_id = check_checkpoint_id(checkpoint_id)
        self.interval_s = interval_ms / 1000
        self.taken = 0

    def start(self) -> None:
        self.data.coordinator.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        if self.data.closed:
            return
        try:
            take_checkpoint(self.data.coordinator, self.data.path, self.checkpoint_id)
            self.taken += 1
        finally:
            if not self.data.closed:
                self.data.coordinator.call_later(self.interval_s, self._tick)
