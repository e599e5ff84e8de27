"""Context data in Redis: runs the data_*.lua scripts on the store's wire (one round trip
each, with the queued writes), reads and writes the data records, checkpoints and the
causal chain, and decodes every reply once into a typed result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.contracts import (
    DATA_MERGE,
    DATA_READ_ALL,
    DATA_READ_GET,
    DATA_SNAPSHOT,
    DATA_SPAWN,
    DATA_WRITE,
    Contract,
)
from ..core.data_keys import DataKeys
from ..core.paths import Path
from ..core.vocabulary import StopReason
from .tree import Store
from .wire import Op


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


@dataclass(frozen=True)
class DataRefused:
    """A refused data script: ``reason`` is ``missing`` (no such context), ``closed``,
    ``too_large`` (``size`` bytes; ``key`` names the value when one value is too
    large, else the context's data as a whole is) or ``state_corrupt`` (the stored
    size, ``value``, is not a canonical integer)."""

    reason: str
    size: int = 0
    key: str | None = None
    value: str = ""


@dataclass(frozen=True)
class Merged:
    """What a merge changed in the parent, and the parent's data sequence after it."""

    sequence: int
    added: tuple[str, ...]
    overwritten: tuple[str, ...]
    merged: tuple[str, ...]


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _refused(reply: Sequence[Any]) -> DataRefused:
    """A ``{0, reason, ...}`` reply (``too_large``: ``size``; a merge's ``value, key,
    size`` or ``<what>, size``)."""
    reason = str(reply[1])
    if reason == StopReason.STATE_CORRUPT:
        return DataRefused(reason, value=str(reply[3]))
    if reason != "too_large":
        return DataRefused(reason)
    if len(reply) >= 5 and str(reply[2]) == "value":
        return DataRefused(reason, int(reply[4]), str(reply[3]))
    return DataRefused(reason, int(reply[-1]))


class DataStore:
    """Context-data operations of one coordinator's store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys = DataKeys(store.ks)

    def _run(self, contract: Contract, keys: list[str], args: list[Any]) -> Any:
        return self.store.run_scripts([(contract.script, keys, args)])[0]

    # -- reads ---------------------------------------------------------------------------

    def get(self, path: Path, key: str) -> Found | None:
        """The value of ``key`` as the context sees it (one round trip, any depth)."""
        res = self._run(DATA_READ_GET,
                        DATA_READ_GET.key_list(levels=self.keys.levels(path.root, path.ids)),
                        DATA_READ_GET.arg_list(mode="get", key=key))
        if int(res[0]) != 1:
            return None
        return Found(str(res[1]), int(res[2]))

    def read_all(self, path: Path, *, local: bool) -> dict[str, str]:
        """Every key the context sees (``local``: its own only), key -> JSON."""
        keys = DATA_READ_ALL.key_list(levels=self.keys.levels(path.root, path.ids))
        return _pairs(self._run(DATA_READ_ALL, keys,
                                DATA_READ_ALL.arg_list(mode="local" if local else "all")))

    def records(self, path: Path, fields: Sequence[str]) -> list[list[str | None]]:
        """``fields`` of the data record of every level, the context's own first."""
        pipe = self.store.client.pipeline(transaction=False)
        for cid in reversed(path.ids):
            pipe.hmget(self.keys.meta(path.root, cid), list(fields))
        return [list(r) for r in pipe.execute()]

    def snapshot(self, path: Path) -> list[LevelRecord]:
        """The data stack the context sees, read atomically, its own level first."""
        levels: list[str] = []
        for cid in reversed(path.ids):
            levels += [self.store.ks.ctx(path.root, cid), self.keys.data(path.root, cid),
                       self.keys.meta(path.root, cid), self.keys.view(path.root, cid)]
        reply = self._run(DATA_SNAPSHOT, DATA_SNAPSHOT.key_list(levels=levels),
                          DATA_SNAPSHOT.arg_list())
        out = []
        for cid, level in zip(reversed(path.ids), reply, strict=False):
            out.append(LevelRecord(cid, int(level[0]), str(level[1]), _pairs(level[2]),
                                   _pairs(level[3]), _pairs(level[4])))
        return out

    # -- writes --------------------------------------------------------------------------

    def write(self, path: Path, sets: Mapping[str, str], deletes: Sequence[str],
              max_context_bytes: int) -> int | DataRefused:
        """Set and delete keys of the context's own data atomically; returns the number
        of keys deleted."""
        root, cid = path.root, path.ctx_id
        keys = DATA_WRITE.key_list(ctx=self.store.ks.ctx(root, cid),
                                   data=self.keys.data(root, cid), dmeta=self.keys.meta(root, cid))
        args = DATA_WRITE.arg_list(max_bytes=max_context_bytes,
                                   sets=[x for kv in sets.items() for x in kv], deletes=deletes)
        res = self._run(DATA_WRITE, keys, args)
        return int(res[2]) if int(res[0]) == 1 else _refused(res)

    def merge(self, path: Path, policy: str, keys: Sequence[str] | None, *,
              max_value_bytes: int, max_context_bytes: int) -> Merged | DataRefused:
        """Merge the context's own data into its parent's (one atomic script)."""
        root, parent = path.root, path.ids[-2]
        script_keys = DATA_MERGE.key_list(
            parent_ctx=self.store.ks.ctx(root, parent), parent_data=self.keys.data(root, parent),
            parent_dmeta=self.keys.meta(root, parent),
            child_data=self.keys.data(root, path.ctx_id))
        res = self._run(DATA_MERGE, script_keys, DATA_MERGE.arg_list(
            policy=policy, max_value_bytes=max_value_bytes, max_bytes=max_context_bytes,
            merged=keys or ()))
        if int(res[0]) != 1:
            return _refused(res)
        changes: dict[str, list[str]] = {"added": [], "overwritten": [], "merged": []}
        for i in range(3, len(res), 2):
            changes[str(res[i])].append(str(res[i + 1]))
        return Merged(int(res[1]), tuple(changes["added"]), tuple(changes["overwritten"]),
                      tuple(changes["merged"]))

    def spawn(self, path: Path, isolation: str, *, is_parallel: bool, step_name: str,
              view: Mapping[str, str] | None = None) -> int | DataRefused:
        """Record a new child's isolation level and step; an isolated child's view is
        frozen now (or set to ``view``, on resume). Returns the size of the view."""
        root, cid = path.root, path.ctx_id
        keys = DATA_SPAWN.key_list(ctx=self.store.ks.ctx(root, cid),
                                   dmeta=self.keys.meta(root, cid), dview=self.keys.view(root, cid),
                                   parents=self.keys.levels(root, path.ids[:-1]))
        args = DATA_SPAWN.arg_list(
            isolation=isolation, parallel=is_parallel, step=step_name,
            view_mode="freeze" if view is None else "given",
            view=[x for kv in (view or {}).items() for x in kv])
        res = self._run(DATA_SPAWN, keys, args)
        return int(res[1]) if int(res[0]) == 1 else _refused(res)

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

    # -- the causal chain ----------------------------------------------------------------

    def queue_chain_event(self, root: str, event_json: str) -> None:
        """Append an event to the tree's causal chain (capped) with the next round trip."""
        self.store.wire.queue(Op("xadd", [self.keys.chain(root)], ["e", event_json]))

    def read_chain(self, root: str) -> list[str]:
        """The JSON of the tree's chain events, oldest first, after the queued writes."""
        self.store.flush()
        raw: list[Any] = list(self.store.client.xrange(self.keys.chain(root)) or [])
        return [str(fields["e"]) for _, fields in raw]
