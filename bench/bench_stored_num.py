"""Cost of lua/lib/numbers.lua's strict stored_num against a plain tonumber check, side by
side in one script run inside Redis (interleaved rounds, Redis TIME around each), as the ratio
strict / tonumber per parsed field and per reserve.lua call at depth 1 and 8.

Run: .venv/bin/python bench/bench_stored_num.py [--rounds 20] [--n 50000]
"""

from __future__ import annotations

import argparse
import statistics

import redis
from short_run import parse  # bench/short_run.py

from coordinator.embedded import RedisServer
from coordinator.store.scripts import libraries_source, prelude

# the check the scripts made before the strict parser: tonumber, then range and integrality
_LOOSE = """
local function loose_num(v)
  if v == nil or v == false then return nil end
  local n = tonumber(v)
  if n == nil or n ~= n or n < 0 or n >= MAX_EXACT or math.floor(n) ~= n then
    return false
  end
  return n
end
"""

_BENCH = """
local values = {'0', '50000', '1000000', '9007199254740991', '20000'}
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[1])
local function run(f)
  local start = clock()
  local sink = 0
  for i = 1, n do
    local v = f(values[i % 5 + 1])
    if v then sink = sink + 1 end
  end
  return clock() - start
end
return {run(loose_num), run(stored_num)}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--n", type=int, default=50_000)
    args = parse(ap, rounds=1, n=1000)
    source = prelude() + libraries_source(["numbers"]) + _LOOSE + _BENCH
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        script = client.register_script(source)
        loose, strict = [], []
        for _ in range(args.rounds):
            a, b = script(args=[args.n])
            loose.append(a / args.n * 1000)
            strict.append(b / args.n * 1000)
        client.close()
    ratio = statistics.median(s / lo for s, lo in zip(strict, loose, strict=True))
    print(f"per field, ns (median of {args.rounds} rounds of {args.n}): "
          f"tonumber check {statistics.median(loose):.0f}, strict {statistics.median(strict):.0f}"
          f"; strict / tonumber {ratio:.2f}")
    # reserve.lua at depth d parses 2 + 3 * dims fields per level (usd, steps: dims = 2)
    for depth in (1, 8):
        fields = depth * (2 + 3 * 2)
        extra_us = fields * (statistics.median(strict) - statistics.median(loose)) / 1000
        print(f"reserve at depth {depth}: {fields} fields parsed, "
              f"{extra_us:+.2f} us of script time per call")


if __name__ == "__main__":
    main()
