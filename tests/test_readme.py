"""The README's quick start runs as written (its first three Python blocks, in one process
standing in for the two)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator import Coordinator, ExecutionContext

README = Path(__file__).resolve().parent.parent / "README.md"


def test_quick_start_runs(coord: Coordinator, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    namespace: dict[str, object] = {}
    for i, block in enumerate(blocks[:3]):
        exec(compile(block, f"README block {i}", "exec"), namespace)  # noqa: S102
    assert capsys.readouterr().out.split() == ["0.024", "aborted"]
    run = namespace["run"]
    assert isinstance(run, ExecutionContext)
    snap = run.get_snapshot()
    assert snap.cost_usd_accumulated == pytest.approx(0.036)
    assert snap.step_count == 3 and snap.aborted
