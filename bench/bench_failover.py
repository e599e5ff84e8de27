"""Spend lost on a failover, by durability setting, side by side in one run.

    .venv/bin/python bench/bench_failover.py [seconds] [lag_ms]

A primary, two replicas that replicate through a proxy delaying the primary's stream by
``lag_ms`` (default 200: a slow link), and three sentinels. Four processes make calls on
one tree (durability ``local`` in the first run, ``replicated`` in the second); after a
third of ``seconds`` (default 12) the primary is SIGKILLed together with the proxies
(what they still hold never reaches a replica), Sentinel promotes a replica, the
processes ride out the switch (calls fail closed meanwhile) and flush at the end.

Prints, per setting: calls made, the spend the callers saw their calls make, the spend
the new primary holds, what is lost (the difference), the settles that found no
reservation and were charged to their path ("orphans") or found no path either (recorded
only, "unpathed"; part of the loss), and the longest stretch without an allowed
call (the fail-closed window). Then, on one Redis, the call rate of one process with no
AOF, ``appendfsync everysec`` and ``appendfsync always``, side by side.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import redis
from short_run import parse  # bench/short_run.py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coordinator import Coordinator, ExecutionConfig, ExecutionContext  # noqa: E402
from coordinator.core.keys import KeySpace  # noqa: E402
from tests.support.invariants import orphans  # noqa: E402
from tests.support.procs import TEST_KEYS  # noqa: E402
from tests.support.topologies import SentinelSet, failover_agent  # noqa: E402

SPAWN = mp.get_context("spawn")


def run(durability: str, seconds: float, lag_ms: int, count: int) -> dict[str, float]:
    with SentinelSet(replicas=2, lag_ms=lag_ms, failover_timeout_ms=60_000) as ss:
        coord = Coordinator.from_url(ss.url, token_keys=TEST_KEYS)
        root = ExecutionContext(ExecutionConfig(max_cost_usd=100_000.0, max_steps=10**7,
                                                max_retries_total=10**7), coordinator=coord)
        coord.store.flush()
        ready, out = SPAWN.Queue(), SPAWN.Queue()
        agents = [SPAWN.Process(target=failover_agent, args=(
            ss.url, root.token, i, seconds, durability, ready, out, 0.0))
            for i in range(count)]
        for a in agents:
            a.start()
        for _ in agents:
            ready.get(timeout=60)
        time.sleep(seconds / 3)
        old = ss.primary_port()
        ss.kill_primary()
        results = [out.get(timeout=seconds + 120) for _ in agents]
        for a in agents:
            a.join(30)
        new = ss.primary_port()
        client = redis.Redis(port=new, decode_responses=True)
        held = int(client.hget(KeySpace().ctx(root.chain_id, root.chain_id), "u:usd") or 0)
        charged, uncharged = orphans(client, root.chain_id)
        spent = sum(r["spent"] for r in results)
        coord.close()
        return {"calls": sum(r["allowed"] for r in results), "spent": spent, "held": held,
                "lost": spent - held, "orphans_charged": charged,
                "orphans_uncharged": uncharged, "gap": max(r["max_gap"] for r in results),
                "failed_over": float(new != old),
                "pending": sum(r["pending"] for r in results)}


def fsync_rates(calls: int = 3000) -> dict[str, float]:
    """Calls per second of one process on one Redis, by persistence setting."""
    from coordinator import WrapOptions, report_usage
    from coordinator.embedded import RedisServer

    rates = {}
    for name, args in (("no AOF", ("--appendonly", "no")),
                       ("appendfsync everysec", ("--appendonly", "yes", "--appendfsync",
                                                 "everysec")),
                       ("appendfsync always", ("--appendonly", "yes", "--appendfsync",
                                               "always"))):
        with RedisServer(extra_args=args) as server:
            coord = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
            root = ExecutionContext(ExecutionConfig(max_cost_usd=100_000.0,
                                                    max_steps=10**7, max_retries_total=10),
                                    coordinator=coord)
            opts = WrapOptions(cost_estimate_hint=0.002)
            start = time.perf_counter()
            for _ in range(calls):
                root.wrap_llm_call(lambda: report_usage(cost_usd=0.001), opts)
            coord.store.flush()
            rates[name] = calls / (time.perf_counter() - start)
            root.close()
            coord.close()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seconds", type=float, nargs="?", default=12.0)
    ap.add_argument("lag_ms", type=int, nargs="?", default=200)
    ap.add_argument("--agents", type=int, default=4, help="processes making calls")
    ap.add_argument("--calls", type=int, default=3000, help="calls per persistence setting")
    args = parse(ap, seconds=3.0, lag_ms=50, agents=1, calls=50)
    seconds, lag_ms = args.seconds, args.lag_ms
    print(f"{args.agents} processes, {seconds:.0f} s, replication lag {lag_ms} ms, primary "
          f"SIGKILLed at {seconds / 3:.0f} s")
    print(f"{'durability':<12}{'calls':>8}{'callers $':>12}{'Redis $':>12}{'lost $':>10}"
          f"{'lost %':>8}{'orphans $':>11}{'unpathed $':>11}{'window s':>10}")
    for durability in ("local", "replicated"):
        r = run(durability, seconds, lag_ms, args.agents)
        pct = 100 * r["lost"] / r["spent"] if r["spent"] else 0.0
        print(f"{durability:<12}{r['calls']:>8.0f}{r['spent'] / 1e6:>12.6f}"
              f"{r['held'] / 1e6:>12.6f}{r['lost'] / 1e6:>10.6f}{pct:>8.2f}"
              f"{r['orphans_charged'] / 1e6:>11.6f}{r['orphans_uncharged'] / 1e6:>11.6f}"
              f"{r['gap']:>10.1f}"
              + ("" if r["failed_over"] else "  (no failover!)")
              + (f"  ({r['pending']:.0f} writes never landed)" if r["pending"] else ""))
    rates = fsync_rates(args.calls)
    base = rates["no AOF"]
    print("\none process, one Redis, calls/s by persistence setting (ratio to no AOF):")
    for name, rate in rates.items():
        print(f"  {name:<22}{rate:>8.0f}  {rate / base:>5.2f}")


if __name__ == "__main__":
    main()
