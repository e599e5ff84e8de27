"""A process's side of quota grants (docs/quotas.md): the rules it knows, the buckets a
new root draws from, a grant topped up when a reserve found it short (ending the old
window's first), the grants ended at a root's close or reclaimed from dead holders, and
the leases of the grants this process uses kept alive."""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..core.paths import Path
from ..core.vocabulary import StopReason
from ..models import ChainMetadata
from ..runtime.coordinator import Coordinator
from ..store.errors import UNAVAILABLE
from ..store.quotas_store import Granted, NotGranted, QuotaStore, TreeGrant, member
from .periods import Window, window_at
from .refusal import refusal_detail
from .rules import QuotaRule, labels_of

log = logging.getLogger("coordinator")

CATALOGUE_TTL_S = 1.0
"""How long a process uses the rules it read before reading them again (a new rule
applies to roots opened after that; a changed limit applies at once, see docs)."""
MAX_STEPS = 4
"""Attempts at one top-up (a rule changed meanwhile, another grant to end first)."""

_keepers: weakref.WeakKeyDictionary[Coordinator, QuotaKeeper] = weakref.WeakKeyDictionary()
_keepers_lock = threading.Lock()


def keeper_of(coord: Coordinator) -> QuotaKeeper:
    """The quota keeper of a coordinator (one per coordinator and process)."""
    found = _keepers.get(coord)
    if found is None:
        with _keepers_lock:
            found = _keepers.get(coord)
            if found is None:
                found = _keepers[coord] = QuotaKeeper(coord)
    return found


@dataclass(frozen=True)
class Refill:
    """What a top-up did: ``again`` (reserve again), or a refusal (``reason``
    ``quota_exceeded`` or ``state_corrupt``, ``detail`` for the node and event)."""

    again: bool
    reason: str = ""
    detail: str = ""


class QuotaKeeper:
    """Quota grants for the trees of one coordinator in this process."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.qs = QuotaStore(coord.store)
        self._rules: dict[str, QuotaRule] = {}
        self._read_at = -CATALOGUE_TTL_S
        self._lock = threading.Lock()
        # (rule, member) -> (grant id, root, bucket index): renewed while this process lives
        self._held: dict[tuple[str, str], tuple[str, str, int]] = {}
        self._renewing = False
        self._attached: set[str] = set()  # roots opened here that draw from quotas

    # -- rules ---------------------------------------------------------------------------

    def rules(self, *, fresh: bool = False) -> dict[str, QuotaRule]:
        """The tenant's rules (read again after CATALOGUE_TTL_S, or now when ``fresh``),
        under the backend breaker of the catalogue's node: while it is down, opens fail
        at once instead of each waiting a timeout."""
        if fresh or time.monotonic() - self._read_at > CATALOGUE_TTL_S:
            rules = {}
            read = self.coord.backend.guard(self.qs.catalogue, self.qs.qk.catalogue())
            for rule_id, text in read.items():
                try:
                    rules[rule_id] = QuotaRule.from_json(text)
                except ValueError:
                    log.warning("quota rule %s is unreadable; skipped", rule_id)
            self._rules, self._read_at = rules, time.monotonic()
        return self._rules

    def _rule(self, rule_id: str, *, fresh: bool = False) -> QuotaRule | None:
        if fresh:
            text = self.qs.rule_json(rule_id)
            rule = QuotaRule.from_json(text) if text else None
            with self._lock:
                if rule is None:
                    self._rules.pop(rule_id, None)
                else:
                    self._rules[rule_id] = rule
            return rule
        return self.rules().get(rule_id) or self._rule(rule_id, fresh=True)

    # -- a root opens --------------------------------------------------------------------

    def attachment(self, path: Path, meta: ChainMetadata
                   ) -> tuple[list[str | int], Callable[[], None]]:
        """The fields naming, in a new root's hash, the buckets of the rules matching its
        labels (the open script writes them), and what to call once the root is open (its
        grants end at its close); the rules are read now."""
        labels = labels_of(meta)
        buckets = []
        for rule in sorted(self.rules().values(), key=lambda r: r.id):
            bucket = rule.bucket_of(labels)
            if bucket is not None:
                buckets.append((rule.id, bucket))

        def opened() -> None:
            if buckets:
                self._attached.add(path.root)
        return self.qs.attach_fields(buckets), opened

    # -- a reserve found a grant short ---------------------------------------------------

    def refill(self, path: Path, short: str, need: dict[str, int]) -> Refill:
        """Top up bucket ``short`` (reserve.lua's '<i> <why>') of ``path``'s tree so that
        ``need`` (by quota dimension) fits, ending a grant of a past window first."""
        index = int(short.split()[0])
        if short.endswith("corrupt"):
            return Refill(False, StopReason.STATE_CORRUPT,
                          f"quota grant {index} of the tree's root holds a corrupt number")
        root, reclaimed = path.root, False
        for _ in range(MAX_STEPS):
            tree = self.qs.tree_grant(root, index)
            if tree is None:
                return Refill(True)
            rule = self._rule(tree.rule_id)
            if rule is None:  # the rule is gone: this bucket no longer limits the tree
                self._end(tree, root, index)
                self.qs.apply(root, index, "-", "", 0, {})
                return Refill(True)
            window = window_at(rule.period, rule.tz, int(self.coord.redis_now_ms()))
            live = tree.grant_id not in ("", "-")
            if live and tree.window != window.id:
                self._end(tree, root, index)
                continue
            room = tree.left if live else {}
            want = {}
            for dim in rule.limits:
                # at least the call's need, and at least 1 where the grant is used up (a
                # call estimated at nothing is refused there, as at a level at its limit)
                have = room.get(dim, 0) if live else 0
                least = max(need.get(dim, 0) - have, 0 if have > 0 else 1)
                want[dim] = (max(least, rule.grant_want(dim)), least)
            granted = self._take(rule, tree.bucket, window, root, index, want)
            if isinstance(granted, NotGranted):
                if granted.reason == "exceeded" and granted.expired and not reclaimed:
                    # dead holders' grants may be what fills the quota: reclaim, ask again
                    reclaimed = True
                    for grant_member, record in granted.expired:
                        self._reclaim(rule.id, grant_member, record)
                    continue
                if granted.reason == "exceeded":
                    return Refill(False, "quota_exceeded",
                                  refusal_detail(rule, tree.bucket, window, granted))
                if granted.reason == "window":
                    self.coord.observe_redis_time(granted.now_ms)
                self._rule(rule.id, fresh=True)
                continue
            other = self.qs.apply(root, index, granted.grant_id, window.id, window.end_ms,
                                  granted.amounts)
            if other is None:
                self._hold(rule.id, member(tree.bucket, window.id, root),
                           (granted.grant_id, root, index))
                return Refill(True)
            if other == "":
                return Refill(True)  # the tree is gone: the reserve says so
        return Refill(True)

    def _take(self, rule: QuotaRule, bucket: str, window: Window, root: str, index: int,
              want: dict[str, tuple[int, int]]) -> Granted | NotGranted:
        lease_ms = self.coord.store.lease_ms
        expire_at = window.end_ms + rule.retention_s * 1000 if window.end_ms else 0
        granted = self.qs.take(rule.id, rule.version, bucket,
                               (window.id, window.start_ms, window.end_ms), expire_at, root,
                               index, secrets.token_hex(6), lease_ms, 2 * lease_ms, want)
        if isinstance(granted, Granted):
            self.coord.observe_redis_time(granted.now_ms)
            for grant_member, record in granted.expired:
                self.coord.call_later(0, partial(self._reclaim, rule.id, grant_member, record))
        return granted

    # -- grants end ----------------------------------------------------------------------

    def _end(self, tree: TreeGrant, root: str, index: int) -> None:
        """End a tree's live grant and settle it on its bucket."""
        if tree.grant_id in ("", "-"):
            return
        consumed = self.qs.end(root, index, tree.grant_id)
        grant_member = member(tree.bucket, tree.window, root)
        self.qs.settle(tree.rule_id, grant_member, tree.grant_id, consumed)
        self._held.pop((tree.rule_id, grant_member), None)

    def end_tree(self, root: str) -> None:
        """A root opened here closed: every grant of its tree ends, what it did not use
        returns (a tree without quotas costs nothing here)."""
        if root not in self._attached:
            return
        self._attached.discard(root)
        for index in range(1, self.qs.tree_buckets(root) + 1):
            tree = self.qs.tree_grant(root, index)
            if tree is not None:
                self._end(tree, root, index)

    def revoke(self, rule_id: str) -> int:
        """End every outstanding grant of a rule (its limits changed, or it was deleted),
        so that the next call of every tree takes a grant under the rule now in force.
        Returns how many grants ended."""
        ended = 0
        for grant_member, record in self.qs.grants(rule_id).items():
            self._reclaim(rule_id, grant_member, record)
            ended += 1
        return ended

    def _reclaim(self, rule_id: str, grant_member: str, record: dict[str, object]) -> None:
        """End a grant found outstanding (its holder dead, or the rule changed): what its
        tree consumed is charged, the rest returns."""
        try:
            root, index, grant_id = str(record["r"]), int(str(record["i"])), str(record["g"])
            consumed = self.qs.end(root, index, grant_id)
            self.qs.settle(rule_id, grant_member, grant_id, consumed)
        except UNAVAILABLE as exc:
            log.warning("could not reclaim quota grant %s: %s", grant_member, exc)

    # -- leases --------------------------------------------------------------------------

    def _hold(self, rule_id: str, grant_member: str, grant: tuple[str, str, int]) -> None:
        with self._lock:
            self._held[(rule_id, grant_member)] = grant
            start = not self._renewing
            self._renewing = True
        if start:
            self.coord.call_later(self.coord.store.lease_ms / 3000, self._renew)

    def _renew(self) -> None:
        """Renew the leases of the grants this process drew from (every lease / 3), and
        report what their trees spent so far to their buckets."""
        with self._lock:
            held = list(self._held.items())
            if not held:
                self._renewing = False
                return
        lease_ms = self.coord.store.lease_ms
        try:
            spent = self.qs.tree_spent([(root, index, gid) for _, (gid, root, index) in held])
            by_rule: dict[str, list[tuple[str, str, dict[str, int] | None]]] = {}
            for ((rule_id, grant_member), (gid, _, _)), used in zip(held, spent, strict=True):
                by_rule.setdefault(rule_id, []).append((grant_member, gid, used))
            for rule_id, grants in by_rule.items():
                alive = self.qs.renew(rule_id, grants, lease_ms)
                with self._lock:
                    for (grant_member, _, _), ok in zip(grants, alive, strict=True):
                        if not ok:
                            self._held.pop((rule_id, grant_member), None)
        except UNAVAILABLE as exc:
            log.warning("could not renew quota grants: %s", exc)
        self.coord.call_later(lease_ms / 3000, self._renew)
