"""Sessions inside the conversation's budget tree: steps and sandbox time are charged,
a stopped or exhausted conversation refuses code, an abort interrupts a running run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator import (
    Coordinator,
    Decision,
    DenyListEgressHook,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
)
from coordinator.sessions import (
    CodeExecutionResult,
    EgressDeniedError,
    ExecutionRefusedError,
    ExecutionSessionIdentity,
    LocalKernelProvider,
    SessionConfig,
    SessionManager,
)
from coordinator.sessions.telemetry import SessionMetrics

PATH = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1", path_id="main")


@pytest.fixture
def manager(coord: Coordinator, short_tmp: Path) -> Iterator[SessionManager]:
    m = SessionManager(coord, LocalKernelProvider(short_tmp / "k"),
                       SessionConfig(price_per_second_usd=0.01, execution_timeout_ms=20_000),
                       metrics=SessionMetrics(CollectorRegistry()))
    yield m
    m.close()


def test_steps_and_sandbox_time_roll_up_and_a_ceiling_refuses(
        coord: Coordinator, manager: SessionManager) -> None:
    conversation = ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=2, max_retries_total=5),
        coordinator=coord)
    first = manager.execute_code(PATH, "import time; time.sleep(0.3); print('ok')",
                                 parent=conversation)
    assert first.success
    session = manager.store.load(PATH)
    assert session is not None and session.budget_path[0] == conversation.chain_id
    assert session.budget_chain_id != conversation.chain_id  # the session's own context
    snap = conversation.get_snapshot()
    assert snap.step_count == 1
    assert snap.cost_usd_accumulated >= 0.003  # >= 0.3 s at $0.01/s, rolled up
    child = ExecutionContext.load_snapshot(session.budget_chain_id, coordinator=coord)
    assert [n.operation_name for n in child.nodes] == ["execute_code"]

    assert manager.execute_code(PATH, "print(1)", parent=conversation).success
    with pytest.raises(ExecutionRefusedError, match="step_limit_exceeded"):
        manager.execute_code(PATH, "print('never runs')", parent=conversation)
    again = manager.store.load(PATH)
    assert again is not None and again.execution_count == 2  # the refusal ran nothing
    conversation.close()


def test_abort_interrupts_a_running_execution_and_kills_nothing_else(
        coord: Coordinator, manager: SessionManager) -> None:
    conversation = ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5),
        coordinator=coord)
    manager.execute_code(PATH, "kept = 'still here'", parent=conversation)
    session = manager.store.load(PATH)
    assert session is not None
    started = Path(session.connection["workdir"]) / "started"
    box: dict[str, CodeExecutionResult] = {}
    runner = threading.Thread(target=lambda: box.setdefault("r", manager.execute_code(
        PATH, "import time\nopen('started', 'w').close()\nfor _ in range(600):\n"
              "    time.sleep(0.05)", parent=conversation)))
    runner.start()
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:  # the cell is running
        time.sleep(0.02)
    aborted_at = time.monotonic()
    conversation.abort("user pressed stop")
    runner.join(timeout=15)
    assert not runner.is_alive()
    assert time.monotonic() - aborted_at < 5
    result = box["r"]
    assert result.interrupted and not result.timed_out and not result.success
    session = manager.store.load(PATH)
    assert session is not None and session.status == "active"  # nothing was killed
    sandbox = manager.sandbox_for(session)
    out = sandbox.run("print(kept)", "python", timeout_s=5, max_output_chars=100)
    assert out.output.strip() == "still here"
    with pytest.raises(ExecutionRefusedError, match="aborted"):
        manager.execute_code(PATH, "print(1)", parent=conversation)
    branch = PATH.model_copy(update={"path_id": "branch"})
    with pytest.raises(ExecutionRefusedError, match="aborted"):
        manager.execute_code(branch, "print(1)", parent=conversation)
    assert manager.store.load(branch) is None  # no sandbox made for a stopped conversation
    conversation.close()


def test_egress_hook_applies_to_urls_the_session_is_told_to_reach(
        coord: Coordinator, manager: SessionManager) -> None:
    pipeline = ShieldPipeline(DenyListEgressHook(["internal.example"]))
    conversation = ExecutionContext(
        ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=5),
        pipeline=pipeline, coordinator=coord)
    assert manager.check_egress(PATH, "https://api.example.org/data",
                                parent=conversation) == Decision.ALLOW
    with pytest.raises(EgressDeniedError):
        manager.check_egress(PATH, "https://db.internal.example/dump", parent=conversation)
    conversation.close()
