"""Quotas in Redis (docs/quotas.md): rules and their audit stream, grants taken from a
bucket's window and settled back (on the rule's slot), and the grant fields in a tree's
root hash (on the tree's slot); each script reply decoded once into a typed result."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.contracts import (
    QUOTA_END,
    QUOTA_GRANT,
    QUOTA_RENEW,
    QUOTA_SET,
    QUOTA_SETTLE,
    QUOTA_TAKE,
)
from ..core.quota_keys import QuotaKeys
from ..errors import QuotaNotFoundError, QuotaRuleError
from .tree import Store
from .wire import Op, command

AUDIT_CAP = 10_000
"""Approximate MAXLEN of a rule's audit stream."""
SHARE_DIVISOR = 4
"""A grant takes at most what remains / (SHARE_DIVISOR * trees asking lately)."""
QUOTA_DIMS = ("usd", "calls", "tok")


def member(bucket: str, window: str, root: str) -> str:
    """The id of one tree's grant from one bucket's window."""
    return f"{bucket}|{window}|{root}"


@dataclass(frozen=True)
class Granted:
    """A grant taken or topped up: its id and cumulative amounts (limited dims only)."""

    grant_id: str
    amounts: dict[str, int]
    now_ms: int
    expired: list[tuple[str, dict[str, Any]]]
    """Grants of the rule whose lease expired: (member, record) to reclaim."""


@dataclass(frozen=True)
class NotGranted:
    """No grant: ``reason`` is ``exceeded`` (then ``dim``, ``limit``, ``spent`` and
    ``in_grants`` say why, and ``expired`` lists the grants to reclaim, which may make
    room), ``stale`` (the rule changed), ``window`` or ``gone``."""

    reason: str
    now_ms: int
    dim: str = ""
    limit: int = 0
    spent: int = 0
    in_grants: int = 0
    expired: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass(frozen=True)
class TreeGrant:
    """One bucket of a tree, as its root hash holds it."""

    rule_id: str
    bucket: str
    grant_id: str
    """'' none, '-' the rule is gone."""
    window: str
    end_ms: int
    left: dict[str, int]
    """Room left in the grant by limited dimension."""


def _expired(reply: Sequence[Any], start: int) -> list[tuple[str, dict[str, Any]]]:
    """The (member, record) pairs of expired grants that end quota_take.lua's reply."""
    return [(str(reply[i]), json.loads(reply[i + 1])) for i in range(start, len(reply), 2)]


def _int(v: Any) -> int:
    """A counter the scripts wrote (a canonical decimal integer); anything else reads as
    0 here (the scripts refuse it: fail closed)."""
    text = str(v) if v is not None else ""
    return int(text) if text.isdigit() else 0


class QuotaStore:
    """The quota scripts and reads, on a tree store's wire and client."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.wire = store.wire
        self.ks = store.ks
        self.qk = QuotaKeys(store.ks)

    # -- rules ---------------------------------------------------------------------------

    def put_rule(self, rule_json: str, rule_id: str, match: Mapping[str, str],
                 limits: Mapping[str, int], actor: str) -> int:
        """Store a rule (new or changed) with its audit event; returns its version."""
        args = QUOTA_SET.arg_list(action="set", actor=actor, definition=rule_json,
                                  audit_cap=AUDIT_CAP, match=json.dumps(dict(match)),
                                  limits=[x for dl in limits.items() for x in dl])
        reply = self.wire.run(Op(QUOTA_SET.script, self._rule_keys(rule_id), args))
        if int(reply[0]) != 1:
            raise QuotaRuleError("match", dict(match), f"a rule's match cannot change (it is "
                                 f"{reply[2]}): delete the rule and create another")
        version = int(reply[1])
        stored = json.loads(rule_json)
        stored["version"] = version
        self.wire.run(command("HSET", self.qk.catalogue(), rule_id, json.dumps(stored)))
        return version

    def delete_rule(self, rule_id: str, actor: str) -> None:
        """Delete a rule (its buckets stay for their retention), with its audit event."""
        reply = self.wire.run(Op(QUOTA_SET.script, self._rule_keys(rule_id), QUOTA_SET.arg_list(
            action="delete", actor=actor, definition="", audit_cap=AUDIT_CAP, match="{}",
            limits=())))
        self.wire.run(command("HDEL", self.qk.catalogue(), rule_id))
        if int(reply[0]) != 1:
            raise QuotaNotFoundError(rule_id)

    def _rule_keys(self, rule_id: str) -> list[str]:
        return QUOTA_SET.key_list(rule=self.qk.rule(rule_id), audit=self.qk.audit(rule_id))

    def _read(self, *args: Any) -> Any:
        """One read on the wire (the hot path's timeouts: a stalled Redis is answered
        within one, as a reserve is)."""
        return self.wire.run(command(*args))

    def catalogue(self) -> dict[str, str]:
        """Rule id -> rule JSON, every rule of the tenant."""
        raw = self._read("HGETALL", self.qk.catalogue())
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        return {str(raw[i]): str(raw[i + 1]) for i in range(0, len(raw), 2)}

    def rule_json(self, rule_id: str) -> str | None:
        """The rule in force, read on its own slot (None: no such rule)."""
        raw = self._read("HGET", self.qk.rule(rule_id), "def")
        return str(raw) if raw else None

    def audit(self, rule_id: str) -> list[dict[str, str]]:
        """The rule's audit events, oldest first."""
        entries: list[Any] = self.store.client.xrange(self.qk.audit(rule_id)) or []
        return [{str(k): str(v) for k, v in fields.items()} for _, fields in entries]

    def grants(self, rule_id: str) -> dict[str, dict[str, Any]]:
        """Member -> record of every outstanding grant of the rule."""
        raw = self.store.client.hgetall(self.qk.grants(rule_id))
        return {str(k): json.loads(v) for k, v in raw.items()}

    def window_buckets(self, rule_id: str, window: str) -> dict[str, dict[str, int]]:
        """Bucket -> its counters (s:<dim>, g:<dim>), for the buckets of one window that
        trees drew from (one round trip for the index, one for the buckets)."""
        client = self.store.client
        names = sorted(str(b) for b in client.smembers(self.qk.window_index(rule_id, window)))
        return {name: self.bucket_counters(rule_id, name, window) for name in names}

    def bucket_counters(self, rule_id: str, bucket: str, window: str) -> dict[str, int]:
        raw = self.store.client.hgetall(self.qk.bucket(rule_id, bucket, window))
        return {str(k): _int(v) for k, v in raw.items()}

    # -- grants on the rule's slot -------------------------------------------------------

    def take(self, rule_id: str, version: int, bucket: str, window: tuple[str, int, int],
             expire_at_ms: int, root: str, index: int, grant_id: str, lease_ms: int,
             takers_ms: int, want: Mapping[str, tuple[int, int]]) -> Granted | NotGranted:
        """Take or top up ``root``'s grant from a bucket's window (quota_take.lua);
        ``want`` maps a dimension to (amount wanted, least)."""
        wid, start, end = window
        qk = self.qk
        keys = QUOTA_TAKE.key_list(
            rule=qk.rule(rule_id), bucket=qk.bucket(rule_id, bucket, wid),
            grants=qk.grants(rule_id), expiry=qk.expiry(rule_id),
            takers=qk.takers(rule_id, bucket, wid), window_index=qk.window_index(rule_id, wid))
        args = QUOTA_TAKE.arg_list(
            version=version, start_ms=start, end_ms=end, expire_at_ms=expire_at_ms,
            member=member(bucket, wid, root), grant_id=grant_id, root=root, index=index,
            lease_ms=lease_ms, share_divisor=SHARE_DIVISOR, takers_ms=takers_ms,
            wants=[x for dim, (amount, least) in want.items() for x in (dim, amount, least)])
        reply = self.wire.run(Op(QUOTA_TAKE.script, keys, args))
        now = int(reply[1])
        if int(reply[0]) != 1:
            reason = str(reply[2])
            if reason == "exceeded":
                return NotGranted(reason, now, str(reply[3]), int(reply[4]), int(reply[5]),
                                  int(reply[6]), _expired(reply, 7))
            return NotGranted(reason, now)
        n = int(reply[3])
        amounts = {str(reply[4 + 2 * i]): int(reply[5 + 2 * i]) for i in range(n)}
        return Granted(str(reply[2]), amounts, now, _expired(reply, 4 + 2 * n))

    def settle(self, rule_id: str, grant_member: str, grant_id: str,
               consumed: Mapping[str, int] | None, expire_at_ms: int = 0) -> bool:
        """Settle an ended grant: ``consumed`` becomes spend (None: unknown, the whole
        grant is charged), the rest returns. False when already settled."""
        bucket, window, _ = grant_member.split("|")
        qk = self.qk
        keys = QUOTA_SETTLE.key_list(bucket=qk.bucket(rule_id, bucket, window),
                                     grants=qk.grants(rule_id), expiry=qk.expiry(rule_id))
        args = QUOTA_SETTLE.arg_list(
            member=grant_member, grant_id=grant_id, unknown=consumed is None,
            consumed=[x for da in (consumed or {}).items() for x in da])
        reply = self.wire.run(Op(QUOTA_SETTLE.script, keys, args))
        return int(reply) == 1

    def renew(self, rule_id: str, grants: Sequence[tuple[str, str, Mapping[str, int] | None]],
              lease_ms: int) -> list[bool]:
        """Extend the leases of grants (member, grant id, what their tree spent of them
        so far, None: unknown) and move that spend into their buckets; which grants are
        still outstanding."""
        qk = self.qk
        buckets: list[str] = []
        per_grant: list[Any] = []
        for grant_member, grant_id, used in grants:
            bucket, window, _ = grant_member.split("|")
            buckets.append(qk.bucket(rule_id, bucket, window))
            per_grant += [grant_member, grant_id,
                          *((used or {}).get(d, -1) if used is not None else -1
                            for d in QUOTA_DIMS)]
        reply = self.wire.run(Op(
            QUOTA_RENEW.script,
            QUOTA_RENEW.key_list(expiry=qk.expiry(rule_id), grants=qk.grants(rule_id),
                                 buckets=buckets),
            QUOTA_RENEW.arg_list(lease_ms=lease_ms, renewals=per_grant)))
        return [bool(int(x)) for x in reply]

    def tree_spent(self, grants: Sequence[tuple[str, int, str]]) -> list[dict[str, int] | None]:
        """For each (root, bucket index, grant id), what the tree spent of that grant so
        far (None: it is not the tree's live grant any more), in one round trip."""
        ops = [command("HMGET", self.ks.ctx(root, root), f"q{i}:g",
                       *(f"q{i}:u:{d}" for d in QUOTA_DIMS)) for root, i, _ in grants]
        out: list[dict[str, int] | None] = []
        for (_, _, grant_id), v in zip(grants, self.wire.round_trip(ops), strict=True):
            if isinstance(v, Exception) or v[0] != grant_id:
                out.append(None)
            else:
                out.append({d: _int(v[1 + j]) for j, d in enumerate(QUOTA_DIMS)})
        return out

    # -- grants in a tree's root hash ----------------------------------------------------

    @staticmethod
    def attach_fields(buckets: Sequence[tuple[str, str]]) -> list[str | int]:
        """The root hash fields naming the (rule, bucket) pairs a new root draws from (it
        has no grant yet): written by the open script itself, so that no reserve can see
        the root without them (none for a root that no rule matches)."""
        if not buckets:
            return []
        fields: list[str | int] = ["q", len(buckets)]
        for i, (rule_id, bucket) in enumerate(buckets, start=1):
            fields += [f"q{i}:id", json.dumps([rule_id, bucket]), f"q{i}:g", ""]
        return fields

    def tree_grant(self, root: str, index: int) -> TreeGrant | None:
        """Bucket ``index`` of a tree (None: no such bucket)."""
        p = f"q{index}:"
        fields = [p + "id", p + "g", p + "w", p + "end"]
        for dim in QUOTA_DIMS:
            fields += [f"{p}l:{dim}", f"{p}u:{dim}", f"{p}h:{dim}"]
        results = self.wire.round_trip([command("HMGET", self.ks.ctx(root, root), *fields)])
        if isinstance(results[0], Exception):
            raise results[0]
        v = results[0]
        if not v[0]:
            return None
        rule_id, bucket = json.loads(v[0])
        left = {dim: _int(v[4 + 3 * j]) - _int(v[5 + 3 * j]) - _int(v[6 + 3 * j])
                for j, dim in enumerate(QUOTA_DIMS) if v[4 + 3 * j] not in (None, "")}
        return TreeGrant(str(rule_id), str(bucket), str(v[1] or ""), str(v[2] or ""),
                         _int(v[3]), left)

    def tree_buckets(self, root: str) -> int:
        """How many quota buckets a tree draws from."""
        return _int(self._read("HGET", self.ks.ctx(root, root), "q"))

    def apply(self, root: str, index: int, grant_id: str, window: str, end_ms: int,
              amounts: Mapping[str, int]) -> str | None:
        """Put a grant into the tree (quota_grant.lua): None when applied, else the id of
        the other live grant ('' when the tree is gone)."""
        args = QUOTA_GRANT.arg_list(index=index, grant_id=grant_id, window=window,
                                    end_ms=end_ms, amounts=[x for da in amounts.items()
                                                            for x in da])
        reply = self.wire.run(Op(QUOTA_GRANT.script,
                                 QUOTA_GRANT.key_list(root=self.ks.ctx(root, root)), args))
        if int(reply[0]) == 1:
            return None
        return str(reply[2]) if len(reply) > 2 else ""

    def end(self, root: str, index: int, grant_id: str) -> dict[str, int] | None:
        """End a tree's grant (quota_end.lua): what it consumed, None when unknown."""
        reply = self.wire.run(Op(QUOTA_END.script,
                                 QUOTA_END.key_list(root=self.ks.ctx(root, root)),
                                 QUOTA_END.arg_list(index=index, grant_id=grant_id)))
        if int(reply[0]) != 1:
            return None
        return {str(reply[i]): int(reply[i + 1]) for i in range(1, len(reply), 2)}
