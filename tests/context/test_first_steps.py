"""First steps of a new user that used to hurt (issue 23): labels without made-up ids, and
the development-key warning said once for a tree spread over processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from coordinator import ChainMetadata, Coordinator, ExecutionConfig, ExecutionContext


def test_chain_metadata_with_labels_only_generates_the_ids(coord: Coordinator) -> None:
    meta = ChainMetadata(service="my-agent", team="research")
    other = ChainMetadata(service="my-agent", team="research")
    assert meta.chain_id and meta.request_id
    assert len({meta.chain_id, meta.request_id, other.chain_id, other.request_id}) == 4
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5,
                                           max_retries_total=1), metadata=meta)
    snap = run.get_snapshot()
    assert (snap.chain_id, snap.request_id) == (meta.chain_id, meta.request_id)
    assert ChainMetadata(chain_id="given", request_id="r").chain_id == "given"
    run.close()


WITHOUT_KEYS = """
import logging, sys
from coordinator import Coordinator, ExecutionConfig, ExecutionContext
logging.basicConfig(level=logging.WARNING)
coord = Coordinator.from_url(sys.argv[1])
if sys.argv[2] == "parent":
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5,
                                           max_retries_total=1), coordinator=coord)
    print(run.spawn_child().token)
else:
    ExecutionContext.attach(sys.argv[2], coordinator=coord).close()
"""


def test_the_development_key_warning_is_said_once_for_a_parent_and_its_children(
        redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BUDGET_TOKEN_KEYS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])

    def run(arg: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", WITHOUT_KEYS, redis_url, arg], env=env,
                              capture_output=True, text=True, timeout=60, check=True)

    parent = run("parent")
    children = [run(parent.stdout.strip()) for _ in range(3)]
    said = [p.stderr.count("BUDGET_TOKEN_KEYS is not set") for p in [parent, *children]]
    assert said == [1, 0, 0, 0], [p.stderr for p in [parent, *children]]
