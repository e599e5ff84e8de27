"""A nemesis: worker processes make wrapped calls (strict and lease mode) on a few trees
while a seeded schedule of faults hurts the Redis nodes under them; then everything is
healed and the books are checked.

    .venv/bin/python bench/nemesis.py --topology cluster --seconds 60 --seed 7
    .venv/bin/python bench/nemesis.py --topology sentinel --durability local

Faults (tests/support/chaos.py puts every node behind a proxy that its clients, sentinels and
replicas go through): SIGKILL a primary (restarted once its replica took over, so it
rejoins as a replica), SIGSTOP a node and resume it, promote a replica by hand (SENTINEL
FAILOVER / CLUSTER FAILOVER), delay a node's replies, cut its connections.

Checked at the end, each a violation (exit 1) when it fails:
- every tree's books (tests/invariants.check_tree): each level's ledger equals the node
  records of its subtree, no ceiling exceeded, nothing held, no reservation or slice open;
- no spend lost: what the workers' calls really spent is all in Redis (``replicated``,
  which waits for every replica: a failover may promote any of them;
  under ``local`` the loss is measured and printed, and a lost hold may let a ceiling pass
  by what it held, so the ceiling check is reported, not enforced);
- every worker whose tree did not stop had calls allowed again at the end (recovery);
- every decision (ALLOW when the call's function started, else the return of the wrap)
  came within the hot-path timeout, once more for a retried reserve, plus ``--margin``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import threading
import time
from collections import Counter
from typing import Any

import redis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coordinator import (  # noqa: E402
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
    report_usage,
)
from coordinator.core.keys import KeySpace  # noqa: E402
from tests.support.chaos import ChaosCluster, ChaosSentinel, Node  # noqa: E402
from tests.support.invariants import check_tree  # noqa: E402
from tests.support.procs import TEST_KEYS  # noqa: E402
from tests.support.topologies import wait_for  # noqa: E402

SPAWN = mp.get_context("spawn")
HOT_MS = 250
LEASE_MS = 2000
RECOVERY_S = 5.0
"""The schedule stops 6 s before the workers do: each worker whose tree did not stop must
have had a call allowed within this long of its end (its Redis recovered)."""
HEAVY_S = 25.0
"""A kill or a promotion ends once every node is back in sync (under ``replicated``, which
asks every replica, calls fail closed until the restarted or demoted node has synced:
16-17 s after a manual Sentinel failover here), and none starts in the last this-many
seconds of the schedule."""


def worker(url: str, token: str, seed: int, seconds: float, lease: bool, durability: str,
           replicas: int, ready: Any, out: Any) -> None:
    """Calls on a child of the tree until ``seconds`` pass or the tree stops; reports
    what its calls spent (functions that ran) and how long each decision took."""
    rng = random.Random(seed)
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS, lease_ms=LEASE_MS,
                                 durability=durability, replicas=replicas,
                                 wait_timeout_ms=HOT_MS // 2,
                                 hot_timeout_ms=HOT_MS)
    root = ExecutionContext.attach(token, coordinator=coord)
    ctx = root.spawn_child(
        lease=LeasePolicy(usd=0.02, steps=20, max_age_ms=500) if lease else False)
    ready.put(seed)
    spent = 0
    decisions: Counter[str] = Counter()
    slowest = 0.0
    allowed_at: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        estimate = rng.choice([200, 500, 1000])
        actual = int(estimate * rng.uniform(0.3, 1.0))
        started: list[float] = []

        def body(started: list[float] = started, actual: int = actual) -> None:
            started.append(time.monotonic())
            report_usage(cost_usd=actual / 1_000_000)

        t0 = time.monotonic()
        d = ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=estimate / 1_000_000))
        slowest = max(slowest, (started[0] if started else time.monotonic()) - t0)
        spent += actual if started else 0
        decisions[d.value] += 1
        if d == Decision.ALLOW:
            allowed_at.append(time.time())
        if d != Decision.ALLOW and (ctx.stop_reason is not None or _spent_out(root)):
            break  # the tree stopped, or its ceiling leaves no room for a call: done
        time.sleep(0.01 if d == Decision.ALLOW else 0.05)
    ended = time.time()
    flushed = _flush(coord)
    try:
        ctx.close()
    except Exception:  # noqa: BLE001 - reported through `flushed`; the reaper has the rest
        flushed = False
    coord.close()
    out.put({"seed": seed, "lease": lease, "spent": spent, "decisions": dict(decisions),
             "slowest": slowest, "flushed": flushed,
             "stop": ctx.stop_reason or ("spent out" if _spent_out(root) else None),
             "quiet_at_end": ended - max(allowed_at, default=0.0),
             "longest_gap": max((b - a for a, b in zip(allowed_at, allowed_at[1:],
                                                           strict=False)), default=0.0)})


def _spent_out(root: ExecutionContext) -> bool:
    """The tree's ceiling leaves less than the largest estimate (read when it answers)."""
    try:
        snap = root.get_snapshot()
    except Exception:  # noqa: BLE001 - a fault: not known to be spent out
        return False
    return 0 < snap.max_cost_usd < snap.cost_usd_accumulated + 0.001


def _flush(coord: Coordinator) -> bool:
    """Land every settle this process has queued, riding out what is left of a fault."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            coord.store.flush()
            if not coord.store.wire._pending:
                return True
        except Exception:  # noqa: BLE001 - Redis may still be failing over
            pass
        time.sleep(0.1)
    return False


class Nemesis(threading.Thread):
    """Injects one fault every 2-5 s from a seeded schedule until ``until``."""

    def __init__(self, topo: ChaosSentinel | ChaosCluster, seed: int, until: float) -> None:
        super().__init__(daemon=True)
        self.topo, self.rng, self.until = topo, random.Random(seed), until
        self.faults: Counter[str] = Counter()
        self.log: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while time.monotonic() + 6 < self.until:
            time.sleep(self.rng.uniform(2, 5))
            kind = self.rng.choice(["kill", "pause", "promote", "delay", "cut"])
            if kind in ("kill", "promote") and time.monotonic() + HEAVY_S > self.until:
                kind = self.rng.choice(["pause", "delay", "cut"])
            try:
                getattr(self, kind)()
                self.faults[kind] += 1
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")

    def _pick(self, primaries_only: bool) -> Node:
        pool = self.topo.primaries() if primaries_only else [
            n for n in self.topo.nodes if n.alive and not n.paused]
        return self.rng.choice(pool)

    def kill(self) -> None:
        node = self._pick(True)
        self.log.append(f"{time.monotonic():.1f} kill {node.proxy_port}")
        node.kill()
        wait_for(lambda: node not in self.topo.primaries() and len(self.topo.primaries())
                 == getattr(self.topo, "count", 1), 30, "a replica to take over")
        node.restart()  # an empty node: it rejoins as a replica of the promoted one
        self.log.append(f"{time.monotonic():.1f} restarted {node.proxy_port}")
        # Redis without persistence: until the restarted node has synced, it is an empty
        # copy that a second failover could promote, wiping the data (Redis' documented
        # hazard of restarting a node that keeps nothing on disk). An operator waits for
        # the sync; so does the schedule.
        wait_for(lambda: node.role() == "slave" and node.client(decode_responses=True).info(
            "replication").get("master_link_status") == "up", 60, "the restarted node to sync")
        self.log.append(f"{time.monotonic():.1f} synced {node.proxy_port}")

    def pause(self) -> None:
        node = self._pick(False)
        seconds = self.rng.uniform(0.3, 1.5)  # below the failure detectors' timeouts
        self.log.append(f"{time.monotonic():.1f} pause {node.proxy_port} {seconds:.1f}s")
        node.pause()
        time.sleep(seconds)
        node.resume()

    def promote(self) -> None:
        # a promotion while a replica still syncs may find none to promote (NOGOODSLAVE):
        # an operator waits for the sync first; so does the schedule
        wait_for(self.topo.healthy, 60, "the replicas to sync before a promotion")
        primary = self._pick(True)
        self.log.append(f"{time.monotonic():.1f} promote a replica of {primary.proxy_port}")
        self.topo.promote(primary)
        wait_for(lambda: primary not in self.topo.primaries(), 20, "the promotion")
        wait_for(self.topo.healthy, 60, "the demoted primary to sync")
        self.log.append(f"{time.monotonic():.1f} synced")

    def delay(self) -> None:
        node = self._pick(False)
        seconds = self.rng.choice([0.05, 0.15, 0.4])
        self.log.append(f"{time.monotonic():.1f} delay {node.proxy_port} {seconds}s")
        node.proxy.delay(seconds)
        time.sleep(self.rng.uniform(1, 3))
        node.proxy.heal()

    def cut(self) -> None:
        node = self._pick(False)
        seconds = self.rng.uniform(0.2, 0.8)
        self.log.append(f"{time.monotonic():.1f} cut {node.proxy_port} {seconds:.1f}s")
        node.proxy.cut(seconds)
        time.sleep(seconds)

    def heal(self) -> None:
        for node in self.topo.nodes:
            node.resume()
            node.proxy.heal()
            if not node.alive:
                node.restart()
        wait_for(self.topo.healthy, 60, "the topology to heal")


def _reap(root: ExecutionContext) -> tuple[Decision, int]:
    """A call in the tree (its reserve reaps what expired there), until one is allowed:
    this process sat idle through the faults, and its first call may be refused while
    its breaker re-learns the healed topology. Returns the last decision and how many
    were refused."""
    refused, end = 0, time.monotonic() + 15
    while True:
        reaper = root.spawn_child()
        d = reaper.wrap_tool_call(lambda: None, WrapOptions(cost_estimate_hint=0.0))
        reaper.close()
        if d == Decision.ALLOW or time.monotonic() > end:
            return d, refused
        refused += 1
        time.sleep(0.5)


def _left_open(client: Any, root: str, reaped: Decision) -> str:
    """What a tree still holds, with each hold's lease left (ms, from Redis' clock)."""
    ks = KeySpace()
    now = int(client.execute_command("TIME", target_nodes=client.get_node_from_key(
        ks.leases(root))) [0]) * 1000 if isinstance(client, redis.RedisCluster) else int(
        client.time()[0]) * 1000
    leases = {k: int(v) - now for k, v in client.zrange(ks.leases(root), 0, -1,
                                                        withscores=True)}
    return (f"(the reaper's call: {reaped.value}) open: {client.hgetall(ks.reservations(root))}"
            f" leases left (ms): {leases}")


def _tree_client(topo: ChaosSentinel | ChaosCluster) -> Any:
    if isinstance(topo, ChaosCluster):
        return redis.RedisCluster(host="127.0.0.1", port=topo.nodes[0].proxy_port,
                                  decode_responses=True)
    return redis.Redis(port=topo.primary().proxy_port, decode_responses=True)


def _roots(coord: Coordinator, topo: ChaosSentinel | ChaosCluster, ceilings: list[float]
           ) -> list[ExecutionContext]:
    """One root per ceiling; on a cluster, spread over the primaries by slot."""
    from redis.crc import key_slot

    roots: list[ExecutionContext] = []
    seen: set[int] = set()
    spread = isinstance(topo, ChaosCluster)
    for _ in range(200):
        if len(roots) == len(ceilings):
            break
        usd = ceilings[len(roots)]
        root = ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=10**7,
                                                max_retries_total=10**7), coordinator=coord)
        third = key_slot(root.chain_id.encode()) * 3 // 16384
        if spread and third in seen and len(seen) < 3:
            root.close()
            continue
        seen.add(third)
        roots.append(root)
    return roots


def run(topology: str, seconds: float, seed: int, workers: int, durability: str,
        margin: float) -> dict[str, Any]:
    topo: ChaosSentinel | ChaosCluster = (ChaosCluster() if topology == "cluster"
                                          else ChaosSentinel())
    topo.start()
    violations: list[str] = []
    try:
        coord = Coordinator.from_url(topo.url, token_keys=TEST_KEYS, lease_ms=LEASE_MS)
        roots = _roots(coord, topo, [1.0, 1.0, 0.05])
        ready, out = SPAWN.Queue(), SPAWN.Queue()
        tree_of = {seed * 100 + i: roots[i % len(roots)].chain_id for i in range(workers)}
        # `replicated` asks every replica: a failover may promote any of them (Sentinel
        # picks by the offsets it last saw), and one that had not acknowledged loses spend
        replicas = len(topo.replicas_of(topo.primaries()[0]))
        procs = [SPAWN.Process(target=worker, args=(
            topo.url, roots[i % len(roots)].token, seed * 100 + i, seconds, i % 2 == 1,
            durability, replicas, ready, out)) for i in range(workers)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        nemesis = Nemesis(topo, seed, time.monotonic() + seconds)
        nemesis.start()
        nemesis.join()
        results = [out.get(timeout=seconds + 180) for _ in procs]
        for p in procs:
            p.join(30)
        nemesis.heal()
        time.sleep(LEASE_MS / 1000 + 0.5)  # every hold of a dead connection expires
        client = _tree_client(topo)
        spent_by_root: Counter[str] = Counter()
        for i, r in enumerate(results):
            spent_by_root[tree_of[r["seed"]]] += r["spent"]
            if not r["flushed"]:
                violations.append(f"worker {i}: settles still queued after healing")
            if r["stop"] is None and r["quiet_at_end"] > RECOVERY_S:
                violations.append(f"worker {i}: no call allowed in the last "
                                  f"{r['quiet_at_end']:.1f} s (its tree never recovered)")
        lost = reaper_refusals = 0
        for root in roots:
            reaped, refused = _reap(root)
            reaper_refusals += refused
            try:
                held = check_tree(client, root.chain_id)
            except AssertionError as exc:
                ceiling = "over ceiling" in str(exc)
                if not (ceiling and durability == "local"):
                    violations.append(f"tree {root.chain_id}: {exc} "
                                      f"{_left_open(client, root.chain_id, reaped)}")
                held = int(client.hget(KeySpace().ctx(root.chain_id, root.chain_id),
                                       "u:usd") or 0)
            lost += max(0, spent_by_root[root.chain_id] - held)  # held: orphans included
        if durability == "replicated" and lost:
            violations.append(f"{lost} micro-USD of acknowledged spend lost")
        bound = 2 * HOT_MS / 1000 + margin
        slowest = max(r["slowest"] for r in results)
        if slowest > bound:
            violations.append(f"a decision took {slowest:.2f} s (bound {bound:.2f} s)")
        violations += [f"fault not injected: {e}" for e in nemesis.errors]
        decisions: Counter[str] = Counter()
        for r in results:
            decisions.update(r["decisions"])
        for root in roots:
            root.close()
        coord.close()
        return {"topology": topology, "durability": durability, "seed": seed,
                "seconds": seconds, "workers": workers, "faults": dict(nemesis.faults),
                "calls": sum(decisions.values()), "decisions": dict(decisions),
                "spent_usd": sum(spent_by_root.values()) / 1e6, "lost_usd": lost / 1e6,
                "slowest_decision_s": round(slowest, 3),
                "longest_gap_s": round(max(r["longest_gap"] for r in results), 2),
                "reaper_refusals": reaper_refusals,
                "violations": violations,
                "schedule": nemesis.log}
    finally:
        topo.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", choices=["sentinel", "cluster"], default="cluster")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--durability", choices=["local", "replicated"], default="replicated")
    ap.add_argument("--margin", type=float, default=1.0,
                    help="seconds a decision may take past the hot-path timeout")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    summary = run(args.topology, args.seconds, args.seed, args.workers, args.durability,
                  args.margin)
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            if key != "schedule":
                print(f"{key:>20}: {value}")
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
