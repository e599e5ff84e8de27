"""What a context token costs, in raw Redis round trips.

Measured in one process against one loopback redis-server started here, interleaved
round by round so that machine drift hits every variant alike:

  ping     one Redis PING round trip (redis-py, hiredis): the unit
  encode   TokenCodec.encode of a depth-3 token
  verify   TokenCodec.decode of a token this codec has not seen: HMAC check and parse
  decode   TokenCodec.decode of a token seen before (its verified claims are cached;
           expiry and tenant are still checked): what a fan-out's repeated token costs
  both     encode + verify: what one hop to a new process adds, besides the attach read

Run: .venv/bin/python bench/bench_tokens.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time
from collections.abc import Callable

import redis
from short_run import parse  # bench/short_run.py

from coordinator.core.token_codec import TokenCodec
from coordinator.embedded import RedisServer


def per_call_us(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = parse(ap, calls=100, rounds=1)

    codec = TokenCodec({"k2": b"bench-secret-0123456789", "k1": b"older-secret-0123456789"})
    path = tuple(f"{i:032x}" for i in range(3))  # ids as ExecutionContext makes them
    now = time.time()
    token = codec.encode(root=path[0], path=path, tenant="acme", ttl_s=3600, now=now)

    def encode() -> object:
        return codec.encode(root=path[0], path=path, tenant="acme", ttl_s=3600, now=now)

    # distinct tokens, more than the codec caches: cycling through them always misses
    fresh = [codec.encode(root=path[0], path=path, tenant="acme", ttl_s=3600 + i, now=now)
             for i in range(4096)]
    turn = itertools.cycle(fresh)

    def verify() -> object:
        return codec.decode(next(turn), now=now, tenant="acme")

    def decode() -> object:
        return codec.decode(token, now=now, tenant="acme")

    def both() -> object:
        encode()
        return verify()

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.ping()
        variants: dict[str, Callable[[], object]] = {
            "ping": client.ping, "encode": encode, "verify": verify, "decode": decode,
            "both": both}
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                n = args.calls // 10 if name == "ping" else args.calls
                samples[name].append(per_call_us(fn, n))
        client.close()

    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"python {platform.python_version()}, token {len(token)} bytes (depth 3), "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'variant':<8} {'us/op':>8} {'x PING':>8}")
    for name, us in med.items():
        print(f"{name:<8} {us:8.2f} {us / med['ping']:8.3f}")


if __name__ == "__main__":
    main()
