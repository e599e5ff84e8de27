"""The README's quick start runs as written (its first three Python blocks, in one process
standing in for the two), and its Celery example runs its task body with the worker it
says to start. Every block of every page: tests/docs/test_docs.py."""

from __future__ import annotations

import code
import re
from pathlib import Path

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.embedded import RedisServer
from coordinator.errors import InvalidConfigError
from tests.support.doc_pages import Block, Page, blocks_of, commands_of, page_env

README = Path(__file__).resolve().parents[2] / "README.md"


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


def test_the_celery_example_runs_its_task_body(tmp_path: Path) -> None:
    """The README says how to start the worker, and its Celery example, typed as written
    with that worker running, runs the task body: the task's call is in the root's spend
    when the root closes (issue 23: it used to close the root before any worker ran)."""
    page = blocks_of("README.md")
    assert any(c.startswith("celery -A agents worker") for b in page if b.lang == "bash"
               for c in commands_of(b))
    said = _after_the_readme(tmp_path, "snap = run.get_snapshot()\n"
                             "print(snap.status, snap.step_count, snap.cost_usd_accumulated)\n")
    assert said.split() == ["closed", "1", "0.012"]


def _after_the_readme(tmp_path: Path, python: str) -> str:
    """What ``python`` prints, typed in after every README block ran as written (with its
    worker) on a redis-server of its own."""
    with RedisServer() as server:
        runner = Page("README.md", tmp_path, page_env(server, tmp_path))
        try:
            runner.run_blocks(lambda text: next((f"not run: {piece}" for piece in
                                                 ("<id>", "./dev", "[--day") if piece in text),
                                                None))
            return runner.type_in(Block("README.md", 0, "python", python))
        finally:
            runner.close()


def test_the_celery_example_task_reports_a_refused_call(tmp_path: Path) -> None:
    """The README's task checks the Decision its call returns (users copy it): sent under
    a context whose budget cannot cover the call's estimate, it says it was refused
    instead of returning notes it never took."""
    said = _after_the_readme(tmp_path, (
        "with ExecutionContext(ExecutionConfig(max_cost_usd=0.01, max_steps=5,\n"
        "                                      max_retries_total=1)) as poor:\n"
        "    print(research.delay('pricing').get(timeout=60))\n"))
    assert said.strip() == "no notes on pricing (HALT)"
