"""What the SDK transport (coordinator.integrations) costs per request, in raw Redis round
trips: an OpenAI client given the transport against the same client without it, on a
local OpenAI-compatible provider (tests/support/fake_provider.py, in a process of its own).

Measured in one process against one loopback redis-server started here, interleaved
request by request in a new order every round (bench/timing.py); each call's
written-behind settle is drained, untimed, after it:

  raw        one EVALSHA of a trivial script (redis-py, hiredis): the unit
  noop       a strict wrap_llm_call of a no-op (what one wrapped call costs)
  bare       client.chat.completions.create(...), no budget
  manual     the same inside ctx.wrap_llm_call(..., WrapOptions(cost_estimate_hint=...))
  transport  budgeted(client), under the same context (strict mode)
  lease      budgeted(client) under a context in lease mode

each non-streaming, and streaming (20 chunks, read to the end; "s-" prefix). Targets:
transport - manual within one strict wrapped call (noop), both in raw round trips;
lease / bare <= 1.1.

Run: .venv/bin/python bench/bench_transport.py [--requests 400]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402 - after the path set-up above
from short_run import parse  # noqa: E402 - bench/short_run.py
from timing import median_ratio_interval, sample_us  # noqa: E402 - bench/timing.py

from coordinator import (  # noqa: E402
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    WrapOptions,
)
from coordinator.embedded import RedisServer, free_port  # noqa: E402
from coordinator.integrations import budgeted  # noqa: E402

BIG = dict(max_cost_usd=1e6, max_steps=10**9, max_retries_total=10**6)
MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]


def start_provider() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.fake_provider", str(port)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=1)
        except urllib.error.HTTPError:
            return proc, url  # answering (404 on /)
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the fake provider did not start") from None
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    args = parse(ap, requests=5)
    provider, url = start_provider()
    try:
        with RedisServer() as server:
            run(server.url, url + "/v1", args.requests)
    finally:
        provider.terminate()
        provider.wait(10)


def run(redis_url: str, base_url: str, n: int) -> None:
    coord = Coordinator.from_url(redis_url, token_keys={"b": b"bench-secret-0123456789"})
    strict = ExecutionContext(ExecutionConfig(**BIG), coordinator=coord)
    # tokens: the transport reserves input and output tokens (lease mode serves calls that
    # reserve tokens only from a slice that has them)
    lease = ExecutionContext(ExecutionConfig(**BIG, lease=LeasePolicy(
        usd=100.0, steps=5000, tokens=10**6, max_age_ms=2000)), coordinator=coord)
    bare = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
    via_strict = budgeted(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0),
                          context=strict)
    via_lease = budgeted(openai.OpenAI(base_url=base_url, api_key="k", max_retries=0),
                         context=lease)
    raw = coord.client.register_script("return 1")
    raw()
    options = WrapOptions(cost_estimate_hint=0.01, model="gpt-4o", provider="openai",
                          input_tokens_estimate=20, max_output_tokens=40)

    def chat(client: openai.OpenAI) -> Callable[[], object]:
        return lambda: client.chat.completions.create(model="gpt-4o", messages=MESSAGES,
                                                      max_tokens=40)

    def streamed(client: openai.OpenAI) -> Callable[[], object]:
        return lambda: sum(1 for _ in client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, max_tokens=40, stream=True,
            stream_options={"include_usage": True}))

    variants: dict[str, Callable[[], object]] = {
        "raw": raw,
        "noop": lambda: strict.wrap_llm_call(_noop),
        "bare": chat(bare),
        "manual": lambda: strict.wrap_llm_call(chat(bare), options),
        "transport": chat(via_strict),
        "lease": chat(via_lease),
        "s-bare": streamed(bare),
        "s-manual": lambda: strict.wrap_llm_call(streamed(bare), options),
        "s-transport": streamed(via_strict),
        "s-lease": streamed(via_lease),
    }
    drain = coord.store.flush
    sample_us(variants, min(n, 30), drain)  # warm up (connections, scripts, the lease's slice)
    samples = sample_us(variants, n, drain)
    med = {k: statistics.median(v) for k, v in samples.items()}
    for c in (bare, via_strict, via_lease):
        c.close()
    for ctx in (strict, lease):
        ctx.close()
    coord.close()

    unit = med["raw"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, redis-server and the fake provider on loopback; "
          f"{n} interleaved requests of each, per-request medians; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"  {'':12s} {'us/request':>10s}  {'raw round trips':>15s}")
    for name, us in med.items():
        print(f"  {name:12s} {us:10.1f}  {us / unit:15.2f}")
    wrapped = med["noop"] / unit
    for prefix, label in (("", "non-streaming"), ("s-", "streaming")):
        added = (med[prefix + "transport"] - med[prefix + "manual"]) / unit
        print(f"  {label}: transport - manual wrap = {added:.2f} raw round trips (target <= "
              f"one strict wrapped call = {wrapped:.2f})")
        for name in ("transport", "lease"):
            a, b = prefix + name, prefix + "bare"
            low, high = median_ratio_interval(samples[a], samples[b])
            target = "  (target <= 1.1)" if name == "lease" else ""
            print(f"    {a} / {b}: {med[a] / med[b]:.3f} [{low:.3f}, {high:.3f}]; "
                  f"added {(med[a] - med[b]) / unit:.2f} raw round trips{target}")


def _noop() -> None:
    return None


if __name__ == "__main__":
    main()
