"""ContextData: one context's data, read through its isolation level, written locally."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.paths import Path
from ..core.vocabulary import StopReason
from ..errors import BackendUnavailableError, ContextNotFoundError, CorruptStateError
from ..store.data import DataRefused, DataStore
from ..store.errors import UNAVAILABLE
from .errors import ContextDataError, DataClosedError, DataTooLargeError, NoParentError
from .model import ExposurePolicy, IsolationLevel, MergePolicy, MergeResult
from .values import DataLimits, check_key, decode_value, encode_value

if TYPE_CHECKING:
    from ..runtime.coordinator import Coordinator

T = TypeVar("T")
_MISSING: Any = object()
_limits: weakref.WeakKeyDictionary[Coordinator, DataLimits] = weakref.WeakKeyDictionary()


def set_data_limits(coordinator: Coordinator, limits: DataLimits) -> None:
    """Make ``limits`` the context-data limits of every context of ``coordinator``
    (default: :meth:`DataLimits.from_env`)."""
    _limits[coordinator] = limits


def data_limits(coordinator: Coordinator) -> DataLimits:
    """The context-data limits in force for ``coordinator``."""
    limits = _limits.get(coordinator)
    if limits is None:
        limits = _limits.setdefault(coordinator, DataLimits.from_env())
    return limits


def redis_call(operation: str, fn: Callable[[], T]) -> T:
    """Run a Redis operation; an unreachable Redis becomes BackendUnavailableError."""
    try:
        return fn()
    except UNAVAILABLE as exc:
        raise BackendUnavailableError(operation, exc) from exc


def refusal(ctx_id: str, refused: DataRefused, limits: DataLimits,
            what: str = "the context's data"
            ) -> ContextDataError | ContextNotFoundError | CorruptStateError:
    """The error a refused data script stands for."""
    if refused.reason == StopReason.MISSING:
        return ContextNotFoundError(ctx_id)
    if refused.reason == StopReason.STATE_CORRUPT:
        return CorruptStateError(ctx_id, "data size (bytes)", refused.value)
    if refused.reason == StopReason.CLOSED:
        return DataClosedError(ctx_id)
    if refused.key is not None:
        return DataTooLargeError("a merged value's JSON", refused.size,
                                 limits.max_value_bytes, refused.key)
    return DataTooLargeError(what, refused.size, limits.max_context_bytes)


def _written(ctx_id: str, reply: int | DataRefused, limits: DataLimits) -> int:
    if isinstance(reply, DataRefused):
        raise refusal(ctx_id, reply, limits)
    return reply


class ContextData:
    """The data of one context (``ctx.data``): JSON values by string key.

    Reads follow the context's isolation level (inherit: live fall-through to the
    ancestors; isolated: the ancestors as they were when it was created; sandboxed:
    nothing above). Writes are local to the context and refused once it is closed.
    Each read and each write is one Redis round trip, whatever the depth."""

    def __init__(self, coordinator: Coordinator, path: Path,
                 closed: Callable[[], bool] = lambda: False) -> None:
        self._coord = coordinator
        self._path = path
        self._closed = closed
        self._ds = DataStore(coordinator.store)
        self.limits = data_limits(coordinator)

    @property
    def chain_id(self) -> str:
        return self._path.ctx_id

    # For the package's other modules (exposure, checkpoints):

    @property
    def path(self) -> Path:
        """Where the context sits in its tree."""
        return self._path

    @property
    def coordinator(self) -> Coordinator:
        return self._coord

    @property
    def store(self) -> DataStore:
        return self._ds

    @property
    def closed(self) -> bool:
        """Whether the handle this data belongs to is closed."""
        return self._closed()

    def _writable(self) -> None:
        if self.closed:
            raise DataClosedError(self._path.ctx_id)

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as this context sees it, else ``default``."""
        check_key(key, self.limits)
        found = redis_call("data get", lambda: self._ds.get(self._path, key))
        return default if found is None else decode_value(found.text)

    def level_of(self, key: str) -> int | None:
        """How many levels up the value of ``key`` comes from (0: this context's own),
        or None when it sees no such key."""
        check_key(key, self.limits)
        found = redis_call("data get", lambda: self._ds.get(self._path, key))
        return None if found is None else found.level

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def to_dict(self, *, local: bool = False) -> dict[str, Any]:
        """Every key this context sees (``local``: only its own), sorted by key."""
        raw = redis_call("data read", lambda: self._ds.read_all(self._path, local=local))
        return {k: decode_value(raw[k]) for k in sorted(raw)}

    def keys(self, *, local: bool = False) -> list[str]:
        """The keys this context sees (``local``: only its own), sorted."""
        return list(self.to_dict(local=local))

    def items(self, *, local: bool = False) -> list[tuple[str, Any]]:
        """(key, value) pairs this context sees (``local``: only its own), sorted."""
        return list(self.to_dict(local=local).items())

    @property
    def isolation(self) -> IsolationLevel:
        """This context's isolation level (recorded in Redis at its creation)."""
        rec = redis_call("data read", lambda: self._ds.records(self._path, ["iso"]))
        return IsolationLevel.of(rec[0][0] or "inherit")

    # -- writes --------------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` in this context's own data."""
        self.update({key: value})

    def update(self, values: Mapping[str, Any]) -> None:
        """Set several keys at once, atomically: all of them or none."""
        if not isinstance(values, Mapping):
            raise TypeError(f"values must be a mapping; got {values!r}")
        encoded = {check_key(k, self.limits): encode_value(k, v, self.limits)
                   for k, v in values.items()}
        self._writable()
        if encoded:
            _written(self._path.ctx_id, redis_call("data set", lambda: self._ds.write(
                self._path, encoded, (), self.limits.max_context_bytes)), self.limits)

    def delete(self, key: str) -> bool:
        """Remove ``key`` from this context's own data (an ancestor's value then shows
        through, as the isolation level allows). Returns whether it was there."""
        check_key(key, self.limits)
        self._writable()
        return _written(self._path.ctx_id, redis_call("data delete", lambda: self._ds.write(
            self._path, {}, (key,), self.limits.max_context_bytes)), self.limits) == 1

    def merge_into_parent(self, policy: MergePolicy | str = MergePolicy.KEEP_EXISTING,
                          keys: Iterable[str] | None = None) -> MergeResult:
        """Merge this context's own data (or only ``keys`` of it) into its parent's, in
        one atomic script, and return what changed. Works after this context stopped or
        closed (work done before an abort is kept); the parent must not be closed."""
        chosen = MergePolicy.of(policy)
        if isinstance(keys, str):
            raise TypeError("keys must be an iterable of keys, not one string")
        wanted = None if keys is None else [check_key(k, self.limits) for k in keys]
        if len(self._path.ids) < 2:
            raise NoParentError(self._path.ctx_id)
        if wanted is not None and not wanted:
            return MergeResult()
        reply = redis_call("data merge", lambda: self._ds.merge(
            self._path, chosen.value, wanted, max_value_bytes=self.limits.max_value_bytes,
            max_context_bytes=self.limits.max_context_bytes))
        if isinstance(reply, DataRefused):
            raise refusal(self._path.ids[-2], reply, self.limits, "the parent's data")
        return MergeResult(added=reply.added, overwritten=reply.overwritten,
                           merged=reply.merged, sequence=reply.sequence)

    def set_exposure(self, policy: ExposurePolicy | None = None,
                     expose_keys: Iterable[str] | None = None) -> None:
        """Set which wrapped tools may see this context's data (inherited by its
        subtree; the nearest policy wins) and narrow what they see to ``expose_keys``
        (every level's ``expose_keys`` apply: a subtree can only narrow further)."""
        if policy is not None and not isinstance(policy, ExposurePolicy):
            raise TypeError(f"policy must be an ExposurePolicy; got {policy!r}")
        if isinstance(expose_keys, str):
            raise TypeError("expose_keys must be an iterable of keys, not one string")
        fields: dict[str, str] = {}
        if policy is not None:
            fields["expose"] = json.dumps(policy.to_json())
        if expose_keys is not None:
            fields["expose_keys"] = json.dumps(
                sorted({check_key(k, self.limits) for k in expose_keys}))
        self._writable()
        if fields:
            redis_call("data exposure", lambda: self._ds.set_record(self._path, fields))

    def __repr__(self) -> str:
        return f"ContextData(chain_id={self._path.ctx_id!r})"
