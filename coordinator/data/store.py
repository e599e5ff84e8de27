"""The Redis side of context data: runs the data_*.lua scripts through the coordinator's
store (one round trip each, with the queued writes) and decodes their replies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ContextNotFoundError
from ..store import Path, Store
from .errors import DataClosedError, DataTooLargeError
from .keys import DataKeys
from .model import MergePolicy, MergeResult
from .values import DataLimits


@dataclass(frozen=True)
class Found:
    """A value found by ``get``: its JSON and how many levels up it came from."""

    text: str
    level: int


@dataclass(frozen=True)
class LevelRecord:
    """One level of a data stack as data_snapshot.lua reads it."""

    ctx_id: str
    created_ms: int
    meta_json: str
    data: dict[str, str]
    record: dict[str, str]
    view: dict[str, str]


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


class DataStore:
    """Context-data operations of one coordinator's store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys = DataKeys(store.ks)

    def _run(self, name: str, keys: list[str], args: Sequence[Any]) -> Any:
        return self.store.run_scripts([(name, keys, list(args))])[0]

    def _refused(self, path: Path, reply: Sequence[Any]) -> None:
        """Raise the error a ``{0, reason, ...}`` reply stands for."""
        reason = str(reply[1])
        if reason == "missing":
            raise ContextNotFoundError(path.ctx_id)
        if reason == "closed":
            raise DataClosedError(path.ctx_id)
        raise AssertionError(f"unexpected reply {reply!r}")

    # -- reads ---------------------------------------------------------------------------

    def get(self, path: Path, key: str) -> Found | None:
        """The value of ``key`` as the context sees it (one round trip, any depth)."""
        res = self._run("data_read", self.keys.levels(path.root, path.ids), ["get", key])
        if int(res[0]) != 1:
            return None
        return Found(str(res[1]), int(res[2]))

    def read_all(self, path: Path, *, local: bool) -> dict[str, str]:
        """Every key the context sees (``local``: its own only), key -> JSON."""
        keys = self.keys.levels(path.root, path.ids)
        return _pairs(self._run("data_read", keys, ["local" if local else "all"]))

    def records(self, path: Path, fields: Sequence[str]) -> list[list[str | None]]:
        """``fields`` of the data record of every level, the context's own first."""
        pipe = self.store.client.pipeline(transaction=False)
        for cid in reversed(path.ids):
            pipe.hmget(self.keys.meta(path.root, cid), list(fields))
        return [list(r) for r in pipe.execute()]

    def snapshot(self, path: Path) -> list[LevelRecord]:
        """The data stack the context sees, read atomically, its own level first."""
        keys: list[str] = []
        for cid in reversed(path.ids):
            keys += [self.store.ks.ctx(path.root, cid), self.keys.data(path.root, cid),
                     self.keys.meta(path.root, cid), self.keys.view(path.root, cid)]
        out = []
        for cid, level in zip(reversed(path.ids), self._run("data_snapshot", keys, []),
                              strict=False):
            out.append(LevelRecord(cid, int(level[0]), str(level[1]), _pairs(level[2]),
                                   _pairs(level[3]), _pairs(level[4])))
        return out

    # -- writes --------------------------------------------------------------------------

    def write(self, path: Path, sets: Mapping[str, str], deletes: Sequence[str],
              limits: DataLimits) -> int:
        """Set and delete keys of the context's own data atomically; returns the number
        of keys deleted."""
        keys = [self.store.ks.ctx(path.root, path.ctx_id),
                self.keys.data(path.root, path.ctx_id), self.keys.meta(path.root, path.ctx_id)]
        args: list[Any] = [limits.max_context_bytes, len(sets)]
        for k, v in sets.items():
            args += [k, v]
        args += list(deletes)
        res = self._run("data_write", keys, args)
        if int(res[0]) == 1:
            return int(res[2])
        if str(res[1]) == "too_large":
            raise DataTooLargeError("the context's data", int(res[2]),
                                    limits.max_context_bytes)
        self._refused(path, res)
        return 0

    def merge(self, path: Path, policy: MergePolicy, keys: Sequence[str] | None,
              limits: DataLimits) -> MergeResult:
        """Merge the context's own data into its parent's (one atomic script)."""
        root, parent = path.root, path.ids[-2]
        script_keys = [self.store.ks.ctx(root, parent), self.keys.data(root, parent),
                       self.keys.meta(root, parent), self.keys.data(root, path.ctx_id)]
        res = self._run("data_merge", script_keys,
                        [policy.value, limits.max_value_bytes, limits.max_context_bytes,
                         *(keys or ())])
        if int(res[0]) == 1:
            changes: dict[str, list[str]] = {"added": [], "overwritten": [], "merged": []}
            for i in range(3, len(res), 2):
                changes[str(res[i])].append(str(res[i + 1]))
            return MergeResult(added=tuple(changes["added"]),
                               overwritten=tuple(changes["overwritten"]),
                               merged=tuple(changes["merged"]), sequence=int(res[1]))
        if str(res[1]) == "too_large":
            if str(res[2]) == "value":
                raise DataTooLargeError("a merged value's JSON", int(res[4]),
                                        limits.max_value_bytes, str(res[3]))
            raise DataTooLargeError("the parent's data", int(res[3]),
                                    limits.max_context_bytes)
        self._refused(Path(root, path.ids[:-1]), res)
        raise AssertionError("unreachable")

    def spawn(self, path: Path, isolation: str, *, is_parallel: bool, step_name: str,
              view: Mapping[str, str] | None = None) -> int:
        """Record a new child's isolation level and step; an isolated child's view is
        frozen now (or set to ``view``, on resume). Returns the size of the view."""
        root, cid = path.root, path.ctx_id
        keys = [self.store.ks.ctx(root, cid), self.keys.meta(root, cid),
                self.keys.view(root, cid), *self.keys.levels(root, path.ids[:-1])]
        args: list[Any] = [isolation, "1" if is_parallel else "0", step_name]
        if view is None:
            args.append("freeze")
        else:
            args.append("given")
            for k, v in view.items():
                args += [k, v]
        res = self._run("data_spawn", keys, args)
        if int(res[0]) != 1:
            self._refused(path, res)
        return int(res[1])

    def set_record(self, path: Path, fields: Mapping[str, str]) -> None:
        """Set fields of the context's data record (exposure policy, checkpoint id)."""
        mapping: dict[Any, Any] = dict(fields)
        self.store.client.hset(self.keys.meta(path.root, path.ctx_id), mapping=mapping)

    # -- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, path: Path, checkpoint_id: str, record_json: str,
                        retention_s: int) -> None:
        """Store a checkpoint in its tree, mark the context with its id and index it."""
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hset(self.keys.checkpoints(path.root), checkpoint_id, record_json)
        pipe.hset(self.keys.meta(path.root, path.ctx_id), "cp", checkpoint_id)
        pipe.set(self.keys.checkpoint_locator(checkpoint_id), path.root, ex=retention_s)
        pipe.execute()

    def load_checkpoint(self, checkpoint_id: str, root: str | None = None) -> str | None:
        """The JSON of a checkpoint, found through its locator unless ``root`` is given."""
        if root is None:
            located = self.store.client.get(self.keys.checkpoint_locator(checkpoint_id))
            if located is None:
                return None
            root = str(located)
        text = self.store.client.hget(self.keys.checkpoints(root), checkpoint_id)
        return None if text is None else str(text)
