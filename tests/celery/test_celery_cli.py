"""``budgetctl``: the demo end to end (real workers, real Redis), and the tree and abort
commands."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.cli import main
from coordinator.embedded import RedisServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_demo_on_a_shared_redis_exits_0_and_leaves_only_expiring_tree_keys(
        own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    client.set("someone-elses-key", "keep me")
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "--redis", own_redis.url, "demo"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ceiling reached" in out
    assert "the abort reached all 6 running sub-agents" in out
    assert "reserved now: $0.000000" in out
    assert "orchestrator demo-" in out and "└── budgetctl.demo.sub_agent" in out
    # scenario 1's sub-agents refused by the ceiling show it (issue 23 item 2)
    assert "refused: budget_exceeded" in out.split("== Scenario 2")[0]
    assert "micro-USD" not in out  # amounts are in dollars
    queue = next(w for w in out.split() if w.startswith("budgetctl-demo-"))
    assert _processes_mentioning(queue) == []  # every worker process is gone
    keys = client.keys("*")
    assert client.get("someone-elses-key") == "keep me"
    ours = [k for k in keys if k != "someone-elses-key"]
    assert ours and not [k for k in ours
                         if not k.startswith(("bc:{", "bc:where:", "bc:spend:"))]
    assert all(client.ttl(k) > 0 for k in ours)  # everything it wrote expires


def test_tree_and_abort_commands(own_redis: RedisServer,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    coord = Coordinator.from_url(own_redis.url, token_keys={"t": b"0123456789abcdef01"})
    cfg = ExecutionConfig(max_cost_usd=2.0, max_steps=10, max_retries_total=2)
    root = ExecutionContext(cfg, coordinator=coord)
    child = root.spawn_child(max_cost_usd=0.5)
    child.spawn_child(max_cost_usd=0.1)
    assert main(["--redis", own_redis.url, "tree", root.chain_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert "$0.0000 / $2.0000" in lines[0] and "running" in lines[0]
    assert lines[1].startswith("└── ") and "/ $0.5000" in lines[1]
    assert lines[2].startswith("    └── ") and "/ $0.1000" in lines[2]

    assert main(["--redis", own_redis.url, "abort", child.chain_id, "ops said so"]) == 0
    assert "aborted" in capsys.readouterr().out
    assert child.get_snapshot().abort_reason == "aborted"
    assert root.get_snapshot().status == "running"  # only the subtree stopped
    assert main(["--redis", own_redis.url, "abort", child.chain_id]) == 0
    assert "already" in capsys.readouterr().out

    assert main(["--redis", own_redis.url, "tree", "no-such-context"]) == 1
    assert "no context 'no-such-context'" in capsys.readouterr().err
    root.close()
    coord.close()
