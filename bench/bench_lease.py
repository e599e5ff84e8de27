"""Lease mode against in-process containment, raw EVALSHA and strict mode, in one run.

One loopback redis-server started here; every figure below comes from this run.

1. One process: a wrapped no-op in lease mode vs veronica-core's in-process
   ``wrap_llm_call`` (the same no-op), at depth 1 and depth 8, interleaved call by call
   (bench/timing.py); per-call median and mean (the mean carries the batch flushes and
   slice refills that lease mode makes every few hundred calls). Strict mode alongside.
2. Eight OS processes on one tree for a few seconds each, one mode at a time: calls/s of
   raw EVALSHA of a trivial script, of wrapped no-ops in lease mode and in strict mode,
   with the Redis CPU per call from INFO commandstats (all commands' usec summed; the main
   thread's INFO cpu alongside, which adds network I/O).
3. Where strict mode's Redis time goes: reserve, settle with and without the node record,
   each measured alone from commandstats; then reserve.lua against a bare script and
   against its libraries alone (the scripts' files composed, never their text edited).
4. Abort to refusal across 8 leasing processes: from ``abort()`` to each process's first
   refused call (all processes on this machine's clock), p50 and max over rounds.

Needs veronica-core (``pip install -e '.[bench]'``).
Run: .venv/bin/python bench/bench_lease.py [--calls 5000] [--seconds 3] [--rounds 3]
[--procs 8] [--parts 1234] (``--quick``: a short run, bench/short_run.py)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis
from short_run import parse  # bench/short_run.py
from timing import sample_us, server_us  # bench/timing.py

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
)
from coordinator.embedded import RedisServer

KEYS = {"b": b"bench-secret-0123456789"}
POLICY = LeasePolicy(usd=10.0, steps=5000, max_age_ms=2000)
BIG = dict(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
OPTS = WrapOptions(cost_estimate_hint=0.0001)


def _noop() -> None:
    return None


# -- 1. one process ------------------------------------------------------------------------

def one_process(url: str, calls: int) -> None:
    try:
        import veronica_core as vc
    except ImportError:
        print("\n1. skipped: veronica-core is not installed (pip install -e '.[bench]')")
        return
    coord = Coordinator.from_url(url, token_keys=KEYS)
    lease_root = ExecutionContext(ExecutionConfig(**BIG, lease=POLICY), coordinator=coord)
    strict_root = ExecutionContext(ExecutionConfig(**BIG), coordinator=coord)
    lease_deep, strict_deep = lease_root, strict_root
    for _ in range(7):
        lease_deep, strict_deep = lease_deep.spawn_child(), strict_deep.spawn_child()
    vcfg = vc.ExecutionConfig(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
    v_root = vc.ExecutionContext(config=vcfg)
    v_deep = v_root
    for _ in range(7):
        v_deep = vc.ExecutionContext(config=vcfg, parent=v_deep)
    vopts = vc.WrapOptions(cost_estimate_hint=0.0001)

    variants: dict[str, Callable[[], object]] = {
        "veronica d1": lambda: v_root.wrap_llm_call(_noop, vopts),
        "veronica d8": lambda: v_deep.wrap_llm_call(_noop, vopts),
        "lease d1": lambda: lease_root.wrap_llm_call(_noop, OPTS),
        "lease d8": lambda: lease_deep.wrap_llm_call(_noop, OPTS),
        "strict d1": lambda: strict_root.wrap_llm_call(_noop, OPTS),
        "strict d8": lambda: strict_deep.wrap_llm_call(_noop, OPTS),
    }
    for fn in variants.values():
        assert fn() == Decision.ALLOW or fn() == vc.Decision.ALLOW
    drain = coord.store.flush
    sample_us(variants, min(calls, 300), drain)  # warm up
    samples = sample_us(variants, calls, drain)
    med = {k: statistics.median(v) for k, v in samples.items()}
    mean = {k: statistics.fmean(v) for k, v in samples.items()}
    client = redis.Redis.from_url(url)
    server = {k: server_us(client, fn, min(calls, 2000), drain) for k, fn in variants.items()}
    scripts = {k: _evalsha_us(client, fn, min(calls, 2000), drain)
               for k, fn in variants.items()}
    print(f"\n1. one process, {calls} interleaved calls of each (us/call; Redis per call, "
          "each variant alone, flushes and refills included: main thread CPU from INFO "
          "cpu, EVALSHA usec from INFO commandstats)")
    print(f"  {'':12s} {'median':>8s} {'mean':>8s} {'Redis CPU':>10s} {'EVALSHA':>8s}")
    for name in variants:
        print(f"  {name:12s} {med[name]:8.1f} {mean[name]:8.1f} {server[name]:10.2f} "
              f"{scripts[name]:8.2f}")
    for depth in ("d1", "d8"):
        a, b = f"lease {depth}", f"strict {depth}"
        print(f"  Redis per call, lease / strict at {depth}: CPU {server[a] / server[b]:.3f}, "
              f"EVALSHA usec {scripts[a] / scripts[b]:.3f} (target <= 0.1)")
    for depth in ("d1", "d8"):
        a, b = f"lease {depth}", f"veronica {depth}"
        print(f"  lease / veronica at {depth}: median {med[a] / med[b]:.2f}, mean "
              f"{mean[a] / mean[b]:.2f} (target <= 1.5)")
    for ctx in (lease_deep, strict_deep, lease_root, strict_root):
        ctx.close()
    coord.close()


def _evalsha_us(client: redis.Redis, fn: Callable[[], object], n: int,
                drain: Callable[[], object]) -> float:
    """EVALSHA usec (INFO commandstats) per call of ``fn`` over ``n`` calls."""
    drain()
    before = _commandstats_usec(client)[0]
    for _ in range(n):
        fn()
    drain()
    return (_commandstats_usec(client)[0] - before) / n


# -- 2. eight processes ------------------------------------------------------------------

def _raw_worker(url: str, sha: str, seconds: float, ready: Any, go: Any, out: Any) -> None:
    client = redis.Redis.from_url(url)
    client.ping()
    ready.put(1)
    n = 0
    go.wait(60)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        client.evalsha(sha, 0)
        n += 1
    out.put(n)


def _wrap_worker(url: str, token: str, seconds: float, ready: Any, go: Any, out: Any
                 ) -> None:
    coord = Coordinator.from_url(url, token_keys=KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ctx.wrap_llm_call(_noop, OPTS)
    ready.put(1)
    n = 0
    go.wait(60)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            ctx.wrap_llm_call(_noop, OPTS)
        n += 50
    ctx.close()
    coord.close()
    out.put(n)


def _commandstats_usec(client: redis.Redis) -> tuple[float, dict[str, float]]:
    """(usec of EVALSHA, usec by command). Every tree operation is a script, and a
    script's usec already contains the commands it calls (which commandstats also counts
    under their own names): EVALSHA's usec alone is the figure, without double counting.
    It is wall time inside Redis: a Redis descheduled by the OS mid-script counts it."""
    stats = client.info("commandstats")
    per = {k.removeprefix("cmdstat_"): float(v["usec"]) for k, v in stats.items()}
    return per.get("evalsha", 0.0), per


def _main_cpu_us(client: redis.Redis) -> float:
    info = client.info("cpu")
    return (float(info["used_cpu_user_main_thread"]) +
            float(info["used_cpu_sys_main_thread"])) * 1e6


def _fleet(url: str, target: Callable[..., None], args: tuple[Any, ...], seconds: float,
           client: redis.Redis, count: int) -> tuple[float, float, float, dict[str, float]]:
    spawn = mp.get_context("spawn")
    ready, go, out = spawn.Queue(), spawn.Event(), spawn.Queue()
    procs = [spawn.Process(target=target, args=(url, *args, seconds, ready, go, out))
             for _ in range(count)]
    for p in procs:
        p.start()
    for _ in procs:  # every process started and connected
        ready.get(timeout=120)
    client.config_resetstat()
    usec0, per0 = _commandstats_usec(client)
    cpu0 = _main_cpu_us(client)
    go.set()
    counts = [out.get(timeout=120) for _ in procs]
    usec1, per1 = _commandstats_usec(client)
    cpu1 = _main_cpu_us(client)
    for p in procs:
        p.join(30)
    calls = sum(counts)
    per = {k: (v - per0.get(k, 0.0)) / calls for k, v in per1.items()
           if v - per0.get(k, 0.0) > 0}
    return calls / seconds, (usec1 - usec0) / calls, (cpu1 - cpu0) / calls, per


def eight_processes(url: str, seconds: float, count: int) -> None:
    client = redis.Redis.from_url(url)
    sha = client.script_load("return 1")
    coord = Coordinator.from_url(url, token_keys=KEYS)
    lease_ctx = ExecutionContext(ExecutionConfig(**BIG, lease=POLICY), coordinator=coord)
    strict_ctx = ExecutionContext(ExecutionConfig(**BIG), coordinator=coord)
    rows = {
        "raw EVALSHA": _fleet(url, _raw_worker, (sha,), seconds, client, count),
        "lease mode": _fleet(url, _wrap_worker, (lease_ctx.token,), seconds, client, count),
        "strict mode": _fleet(url, _wrap_worker, (strict_ctx.token,), seconds, client, count),
    }
    print(f"\n2. {count} processes on one tree, {seconds:g} s each")
    print(f"  {'':12s} {'calls/s':>9s} {'EVALSHA us/call':>16s} {'main CPU us/call':>17s}")
    for name, (rate, usec, cpu, _per) in rows.items():
        print(f"  {name:12s} {rate:9.0f} {usec:16.2f} {cpu:17.2f}")
    raw, lease, strict = rows["raw EVALSHA"], rows["lease mode"], rows["strict mode"]
    print(f"  lease calls/s / raw EVALSHA calls/s: {lease[0] / raw[0]:.2f} (target >= 1)")
    print(f"  Redis per call, lease / strict: EVALSHA usec {lease[1] / strict[1]:.3f}, "
          f"main thread CPU {lease[2] / strict[2]:.3f} (target <= 0.1)")
    print(f"  strict / raw Redis per call: EVALSHA usec {strict[1] / raw[1]:.1f}x, main "
          f"thread CPU {strict[2] / raw[2]:.1f}x")
    for name in ("lease mode", "strict mode"):
        per = rows[name][3]
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"  {name} commandstats by command (us/call; script-called ones are "
              f"inside evalsha): {top}")
    lease_ctx.close()
    strict_ctx.close()
    coord.close()


# -- 3. where strict mode's Redis time goes ------------------------------------------------

def strict_breakdown(url: str, n: int) -> None:
    from coordinator.core.amounts import actual_amounts, reserve_amounts

    client = redis.Redis.from_url(url)
    coord = Coordinator.from_url(url, token_keys=KEYS)
    ctx = ExecutionContext(ExecutionConfig(**BIG), coordinator=coord)
    path, store = ctx._path, coord.store
    amounts = reserve_amounts(OPTS)
    spent = actual_amounts(100, 0, 0, None)
    node = {"node_id": "x" * 32, "parent_id": None, "kind": "llm", "operation_name": "",
            "start_ts": time.time(), "end_ts": time.time(), "status": "ok", "cost_usd": 1e-4,
            "retries_used": 0, "input_tokens": 0, "output_tokens": 0, "provider": None,
            "model": None}

    def usec() -> float:
        return _commandstats_usec(client)[0]

    ids = [f"bench{i}" for i in range(2 * n)]
    client.config_resetstat()
    marks = [(usec(), _main_cpu_us(client))]
    for rid in ids:
        store.reserve(path, rid, amounts)
    marks.append((usec(), _main_cpu_us(client)))
    for rid in ids[:n]:
        store.finish(path, rid, outcome="ok", node=node, amounts=spent, write_behind=False)
    marks.append((usec(), _main_cpu_us(client)))
    for rid in ids[n:]:
        store.finish(path, rid, outcome="ok", node=None, amounts=spent, write_behind=False)
    marks.append((usec(), _main_cpu_us(client)))
    per = [2 * n, n, n]
    rows = [((marks[i + 1][0] - marks[i][0]) / per[i], (marks[i + 1][1] - marks[i][1]) / per[i])
            for i in range(3)]
    print(f"\n3. strict mode, where Redis time goes ({n}+ of each alone, depth 1; EVALSHA "
          "usec / main thread CPU, us per op)")
    names = ("reserve", "settle + node record", "settle, no node record")
    for name, (us, cpu) in zip(names, rows, strict=True):
        print(f"  {name:24s} {us:7.2f} {cpu:7.2f}")
    print(f"  the node record's XADD: {rows[1][0] - rows[2][0]:.2f} / "
          f"{rows[1][1] - rows[2][1]:.2f}; a call without tokens writes no ledger event and "
          "no SafetyEvent")
    _reserve_dissected(client, store, path, amounts, n)
    ctx.close()
    coord.close()


def _reserve_dissected(client: redis.Redis, store: Any, path: Any,
                       amounts: list[str | int], n: int) -> None:
    """reserve.lua's EVALSHA usec against a bare script and against its libraries
    alone (the files the loader composes, read as they are), and the usec of the commands
    it calls: what the libraries' loading and a ``redis.call`` cost beyond the commands."""
    from coordinator.core.contracts import RESERVE
    from coordinator.store.scripts import (
        declared,
        libraries_source,
        lua_dir,
        prelude,
        script_source,
    )

    uses = declared((lua_dir() / "reserve.lua").read_text(), "uses")
    libraries = prelude() + libraries_source(uses)
    keys = [store.ks.reservations(path.root), store.ks.leases(path.root),
            *store._level_keys(path), store.ks.done(path.root)]
    variants = {
        "bare 'return 1', same ARGV": "return 1",
        "prelude + libraries, return 1": libraries + "\nreturn 1",
        "reserve.lua": script_source("reserve"),
    }
    print("  reserve.lua dissected (EVALSHA usec / usec of the commands it calls, us):")
    for name, text in variants.items():
        script = client.register_script(text)
        client.delete(keys[0], keys[1])
        client.config_resetstat()
        for i in range(n):
            script(keys=keys, args=RESERVE.arg_list(
                reservation_id=f"dissect{name[:6]}{i}", lease_ms=60_000,
                path=",".join(path.ids), abort_channel="ch", keyed=False, final=False,
                below=0, rungs=[], amounts=amounts))
        stats = {k.removeprefix("cmdstat_"): float(v["usec"])
                 for k, v in client.info("commandstats").items()}
        inner = sum(v for k, v in stats.items()
                    if k not in ("evalsha", "eval", "info") and not k.startswith(
                        ("config", "script")))
        print(f"    {name:30s} {stats.get('evalsha', 0.0) / n:7.2f} {inner / n:7.2f}")


# -- 4. abort to refusal ------------------------------------------------------------------

def _abort_worker(url: str, token: str, ready: Any, out: Any) -> None:
    coord = Coordinator.from_url(url, token_keys=KEYS)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ready.put(1)
    refused = 0.0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if ctx.wrap_llm_call(_noop, OPTS) != Decision.ALLOW:
            refused = time.time()
            break
    ctx.close()
    coord.close()
    out.put(refused)


def abort_to_refusal(url: str, rounds: int, count: int) -> None:
    spawn = mp.get_context("spawn")
    coord = Coordinator.from_url(url, token_keys=KEYS)
    lags: list[float] = []
    last: list[float] = []
    for _ in range(rounds):
        root = ExecutionContext(ExecutionConfig(**BIG, lease=POLICY), coordinator=coord)
        ready, out = spawn.Queue(), spawn.Queue()
        procs = [spawn.Process(target=_abort_worker, args=(url, root.token, ready, out))
                 for _ in range(count)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        time.sleep(0.5)
        t0 = time.time()
        root.abort("bench")
        got = [out.get(timeout=60) - t0 for _ in procs]
        for p in procs:
            p.join(30)
        lags += got
        last.append(max(got))
        root.close()
    coord.close()
    print(f"\n4. abort to refusal across {count} leasing processes, {rounds} rounds")
    print(f"  per process: p50 {statistics.median(lags) * 1e3:.1f} ms, max "
          f"{max(lags) * 1e3:.1f} ms; to the last process: p50 "
          f"{statistics.median(last) * 1e3:.1f} ms, max {max(last) * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=8, help="processes in parts 2 and 4")
    ap.add_argument("--ops", type=int, default=2000, help="operations of each kind in part 3")
    ap.add_argument("--parts", default="1234", help="which parts to run (default: all)")
    args = parse(ap, calls=50, seconds=0.3, rounds=1, procs=1, ops=20)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server on loopback (started here)")
    with RedisServer() as server:
        if "1" in args.parts:
            one_process(server.url, args.calls)
        if "2" in args.parts:
            eight_processes(server.url, args.seconds, args.procs)
        if "3" in args.parts:
            strict_breakdown(server.url, args.ops)
        if "4" in args.parts:
            abort_to_refusal(server.url, args.rounds, args.procs)


if __name__ == "__main__":
    main()
