"""Redis CPU of the finished-ids bookkeeping a settle does (bc:{R}:fin), by variant.

Each variant is a script doing only that part of settle.lua's work (Redis TIME, then the
zset writes), run 20,000 times per round in pipelines of 500, 5 rounds, in one
redis-server started here; the figure is the Redis main thread's CPU per script call
(INFO cpu), median of the rounds:

  none          TIME only: the unit
  zadd          + ZADD of the finished id (what every settle must do)
  zadd+trim/16  + ZREMRANGEBYSCORE of the ids older than an hour on one call in 16
                (by Redis ms), as lua/lib/finished_ids.lua does
  zadd+trim     + that trim on every call (the earlier form)

Run: .venv/bin/python bench/bench_fin.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import uuid

import redis
from short_run import parse  # bench/short_run.py

from coordinator.embedded import RedisServer

_NOW = ("local t = redis.call('TIME') "
        "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) ")
_TRIM = "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000) "
VARIANTS = {
    "none": _NOW + "return 1",
    "zadd": _NOW + "redis.call('ZADD', KEYS[1], now, ARGV[1]) return 1",
    "zadd+trim/16": _NOW + "redis.call('ZADD', KEYS[1], now, ARGV[1]) "
                    "if now % 16 == 0 then " + _TRIM + "end return 1",
    "zadd+trim": _NOW + "redis.call('ZADD', KEYS[1], now, ARGV[1]) " + _TRIM + "return 1",
}
BATCH = 500


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = parse(ap, calls=200, rounds=1)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

        def cpu_us() -> float:
            info = client.info("cpu")
            return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6

        shas = {name: client.script_load(src) for name, src in VARIANTS.items()}
        per_call: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, sha in shas.items():  # interleaved: load drift hits every variant
                ids = [uuid.uuid4().hex for _ in range(args.calls)]
                before = cpu_us()
                for start in range(0, args.calls, BATCH):
                    pipe = client.pipeline(transaction=False)
                    for i in ids[start:start + BATCH]:
                        pipe.evalsha(sha, 1, "bc:{R}:fin:" + name, i)
                    pipe.execute()
                per_call[name].append((cpu_us() - before) / args.calls)
        print(f"Redis CPU us per call, median of {args.rounds} rounds of {args.calls:,}")
        for name, values in per_call.items():
            print(f"  {name:13s} {statistics.median(values):5.2f}   "
                  f"(rounds: {', '.join(f'{v:.2f}' for v in sorted(values))})")


if __name__ == "__main__":
    main()
