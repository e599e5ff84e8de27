"""The README's quick start runs as written (its first three Python blocks, in one process
standing in for the two)."""

from __future__ import annotations

import code
import re
from pathlib import Path

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.errors import InvalidConfigError

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


def test_quick_start_runs_typed_into_a_repl(coord: Coordinator,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Line by line, as the interactive interpreter reads them (a blank line ends a block),
    with nothing left pending and no error."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    console = code.InteractiveConsole()
    for block in blocks[:3]:
        for line in [*block.splitlines(), ""]:
            console.push(line)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Error" not in err, err
    words = out.split()
    assert "0.024" in words and words[-1] == "aborted"
    run = console.locals["run"]
    assert isinstance(run, ExecutionContext) and run.get_snapshot().aborted


def test_quick_start_names_the_limits_it_needs() -> None:
    """The first snippet shows the three required limits and no timeout that would end a
    REPL session halfway; leaving one out names it, without the specification's jargon."""
    first = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)[0]
    assert "timeout_ms" not in first.split("config = ")[1]
    assert "Three limits are required" in first
    with pytest.raises(InvalidConfigError) as err:
        ExecutionConfig(max_cost_usd=1.0)  # type: ignore[call-arg]
    assert str(err.value) == ("invalid ExecutionConfig: max_steps: required; "
                              "max_retries_total: required")
    assert err.value.phase == "preflight"  # the specification's name stays on the error
