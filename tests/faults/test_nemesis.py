"""The nemesis in its short form (bench/nemesis.py): 60 s of seeded faults on each
topology under worker processes, then the books, the recovery and the decision times
are checked. The long form and its figures are in docs/topology.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.topologies import sentinel_missing

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.flaky(reruns=1)  # a violation in 1 of 3 fresh-clone runs on Cluster (issue 24)
@pytest.mark.parametrize("topology", ["sentinel", "cluster"])
def test_nemesis_short_form(topology: str) -> None:
    if topology == "sentinel" and sentinel_missing():
        pytest.skip(str(sentinel_missing()))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nemesis.py"), "--topology", topology,
         "--seconds", "60", "--seed", "7", "--json"],
        capture_output=True, text=True, timeout=560, cwd=ROOT)
    assert done.stdout.strip(), done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["violations"] == [], summary
    assert done.returncode == 0
    assert sum(summary["faults"].values()) >= 8, summary["faults"]  # the schedule ran
    assert summary["decisions"].get("ALLOW", 0) > 1000, summary["decisions"]
