"""What metering a streamed response costs per chunk, in raw Redis round trips.

Measured in one process against one loopback redis-server started here, interleaved
round by round so that machine drift hits every variant alike:

  ping       one Redis PING round trip (redis-py, hiredis): the unit
  raw        iterating a stream of OpenAI chat chunks (dicts), per chunk
  metered    the same stream through metered_stream, its usage going to a call's
             collector as in a wrapped call, per chunk
  anthropic  an Anthropic SDK event stream through metered_stream, per event

The figure that matters is (metered - raw) / ping: what each chunk adds, next to the one
round trip a whole wrapped call costs. A provider sends tens of chunks a second.

Run: .venv/bin/python bench/bench_streaming.py [--chunks 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis
from short_run import parse  # bench/short_run.py

from coordinator.context.streaming import metered_stream
from coordinator.core.usage import UsageCollector, reset_collector, set_collector
from coordinator.embedded import RedisServer


def openai_chunks(n: int) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-AbC", "object": "chat.completion.chunk", "created": 1741570283,
            "model": "gpt-4o-2024-08-06"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"content": f" w{i % 10}"},
                                    "finish_reason": None}], "usage": None}
              for i in range(n)]
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 57,
                                                     "completion_tokens": n}})
    return chunks


def anthropic_events(n: int) -> list[Any]:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5", "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 25, "output_tokens": 1}}}]
    events += [{"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": f" w{i % 10}"}} for i in range(n)]
    events.append({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": n}})
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    return [adapter.validate_python(e) for e in events]


def per_item_us(fn: Callable[[], int]) -> float:
    start = time.perf_counter()
    n = fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = parse(ap, chunks=50, rounds=1)
    chunks = openai_chunks(args.chunks)
    events = anthropic_events(args.chunks)

    def raw() -> int:
        return sum(1 for _ in iter(chunks))

    def in_a_call(source: list[Any]) -> int:
        token = set_collector(UsageCollector())
        try:
            return sum(1 for _ in metered_stream(iter(source)))
        finally:
            reset_collector(token)

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.ping()

        def ping() -> int:
            for _ in range(200):
                client.ping()
            return 200

        variants: dict[str, Callable[[], int]] = {
            "ping": ping, "raw": raw, "metered": lambda: in_a_call(chunks),
            "anthropic": lambda: in_a_call(events)}
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                samples[name].append(per_item_us(fn))
        client.close()

    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"python {platform.python_version()}, {args.chunks} chunks a stream, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'variant':<10} {'us/chunk':>9} {'x PING':>8}")
    for name, us in med.items():
        print(f"{name:<10} {us:9.2f} {us / med['ping']:8.3f}")
    added = med["metered"] - med["raw"]
    print(f"metering adds {added:.2f} us a chunk = {added / med['ping']:.3f} PING")


if __name__ == "__main__":
    main()
