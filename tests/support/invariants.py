"""Invariant checks read straight from Redis after a concurrent run."""

from __future__ import annotations

import json

import redis

from coordinator.core.keys import KeySpace


def subtree(client: redis.Redis, ks: KeySpace, root: str, ctx_id: str) -> list[str]:
    out = [ctx_id]
    for kid in client.smembers(ks.kids(root, ctx_id)):
        out += subtree(client, ks, root, kid.decode() if isinstance(kid, bytes) else kid)
    return out


def check_tree(client: redis.Redis, root: str, ks: KeySpace | None = None) -> int:
    """Assert, for every context of the tree: its committed cost equals the sum of the
    settled calls in its subtree, it is within its ceiling, nothing is held, and no
    reservation, lease or budget slice is open. Returns the root's committed micro-USD."""
    ks = ks or KeySpace()
    assert client.hlen(ks.reservations(root)) == 0, "reservations left open"
    assert client.zcard(ks.leases(root)) == 0, "leases left open"
    assert client.scard(ks.slices(root)) == 0, "budget slices (lease mode) left open"
    node_cost: dict[str, int] = {}
    node_steps: dict[str, int] = {}
    node_retries: dict[str, int] = {}
    for ctx_id in subtree(client, ks, root, root):
        cost = steps = retries = 0
        for entry in client.lrange(ks.nodes(root, ctx_id), 0, -1):
            n = json.loads(entry)
            cost += round(n.get("cost_usd", 0.0) * 1_000_000)
            if "steps_used" in n:  # a wrapped call's record says what it counted
                steps += n["steps_used"]
            else:  # a reaped call (lost) counted one; a charge none
                steps += n["status"] in ("ok", "lost") and n["kind"] != "charge"
            retries += n.get("retries_used", 0)
        node_cost[ctx_id], node_steps[ctx_id], node_retries[ctx_id] = cost, steps, retries
    for ctx_id in node_cost:
        h = {k.decode() if isinstance(k, bytes) else k: (v.decode() if isinstance(v, bytes) else v)
             for k, v in client.hgetall(ks.ctx(root, ctx_id)).items()}
        members = subtree(client, ks, root, ctx_id)
        used = int(h.get("u:usd", 0))
        assert used == sum(node_cost[m] for m in members), f"{ctx_id}: ledger != settled calls"
        assert int(h.get("u:steps", 0)) == sum(node_steps[m] for m in members), ctx_id
        assert int(h.get("u:retries", 0)) == sum(node_retries[m] for m in members), ctx_id
        assert used <= int(h["l:usd"]), f"{ctx_id}: {used} over ceiling {h['l:usd']}"
        held = {k: v for k, v in h.items() if k.startswith("h:") and int(v) != 0}
        assert not held, f"{ctx_id}: still held {held}"
    return int(client.hget(ks.ctx(root, root), "u:usd") or 0)


def orphans(client: redis.Redis, root: str, ks: KeySpace | None = None) -> tuple[int, int]:
    """Micro-USD of the settles that found no reservation (SettleOrphaned events on the
    tree's ledger stream): (charged to their path, not charged). The charged ones are in
    the ledgers check_tree checks (their node records too); the others are spend Redis
    holds nowhere else, so a caller's own count must add them."""
    ks = ks or KeySpace()
    charged = lost = 0
    for _, fields in client.xrange(ks.ledger(root)):
        event = json.loads(fields[b"e"] if b"e" in fields else fields["e"])
        if event.get("type") == "SettleOrphaned":
            usd = int(event["amounts"].get("usd", 0)) if event["amounts"] else 0
            if event["charged"]:
                charged += usd
            else:
                lost += usd
    return charged, lost
