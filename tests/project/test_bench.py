"""Every benchmark runs: each bench/bench_*.py in its short form (``--quick``,
bench/short_run.py), as ``./dev bench`` would run it, exits 0. Its figures are not
checked (they mean nothing on tiny sizes); that the script gets through every part is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each benchmark in its short form, in processes of its own
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("bench_*.py"))


def test_every_benchmark_is_listed() -> None:
    assert "bench_lease.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_runs_in_its_short_form(script: str) -> None:
    done = subprocess.run([sys.executable, f"bench/{script}", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n" \
                                 f"{done.stderr[-4000:]}"
