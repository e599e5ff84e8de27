"""The ExecutionContext specification's examples and the linking specification's
three-level chain, run as written (imports from coordinator)."""

from __future__ import annotations

import pytest

from coordinator import (
    ChainMetadata,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
    WrapOptions,
    report_usage,
)


def call_llm(prompt: str) -> dict[str, object]:
    report_usage(cost_usd=0.015)
    return {"text": f"summary of {prompt!r}"}


def test_example_1_single_request_chain(coord: object) -> None:
    config = ExecutionConfig(max_cost_usd=0.50, max_steps=10, max_retries_total=3,
                             timeout_ms=15_000)
    meta = ChainMetadata(request_id="req-001", chain_id="chain-001", org_id="acme",
                         team="ml-platform", service="summariser", user_id="user-42",
                         model="gpt-4o", tags={"env": "prod"})
    pipeline = ShieldPipeline()

    with ExecutionContext(config=config, pipeline=pipeline, metadata=meta) as ctx:
        decision = ctx.wrap_llm_call(
            fn=lambda: call_llm(prompt="Summarise this document."),
            options=WrapOptions(operation_name="summarise", cost_estimate_hint=0.02),
        )
        assert decision == Decision.ALLOW

    snap = ctx.get_snapshot()
    assert snap.chain_id == "chain-001"
    assert snap.request_id == "req-001"
    assert snap.step_count == 1
    assert snap.cost_usd_accumulated == pytest.approx(0.015)
    assert [n.operation_name for n in snap.nodes] == ["summarise"]
    assert snap.nodes[0].status == "ok"
    assert snap.status == "closed"
    assert snap.aborted is False


def test_example_2_agent_loop_with_step_limit(coord: object) -> None:
    config = ExecutionConfig(max_cost_usd=2.00, max_steps=20, max_retries_total=5,
                             timeout_ms=60_000)
    ctx = ExecutionContext(config=config)
    processed = []

    def agent_step(step: int) -> None:
        report_usage(cost_usd=0.01)

    halted_at = None
    try:
        for step in range(100):
            decision = ctx.wrap_llm_call(
                fn=lambda: agent_step(step),
                options=WrapOptions(operation_name=f"agent_step_{step}"),
            )
            if decision == Decision.HALT:
                snap = ctx.get_snapshot()
                halted_at = snap.step_count
                last = snap.events[-1].event_type if snap.events else "none"
                break
            processed.append(step)
    finally:
        snap = ctx.get_snapshot()
    assert halted_at == 20
    assert last == "step_limit_exceeded"
    assert len(processed) == 20
    assert snap.step_count == 20
    assert snap.cost_usd_accumulated == pytest.approx(0.20)
    assert snap.aborted and snap.abort_reason == "step_limit_exceeded"
    assert any(e.hook == "ExecutionContext" and e.event_type == "step_limit_exceeded"
               for e in snap.events)
    ctx.close()


def test_three_level_chain_propagates_cost(coord: object) -> None:
    def expensive_llm_call() -> None:
        report_usage(cost_usd=0.20)

    orch_cfg = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=20)
    with ExecutionContext(orch_cfg) as orch:
        with orch.spawn_child(max_cost_usd=0.60) as agent_a:
            with agent_a.spawn_child(max_cost_usd=0.30) as agent_b:
                assert agent_b.wrap_llm_call(fn=expensive_llm_call) == Decision.ALLOW
                assert agent_b.get_snapshot().cost_usd_accumulated == pytest.approx(0.20)
                assert agent_a.get_snapshot().cost_usd_accumulated == pytest.approx(0.20)
                assert orch.get_snapshot().cost_usd_accumulated == pytest.approx(0.20)
                assert agent_b.get_snapshot().parent_chain_id == agent_a.chain_id
        final = orch.get_snapshot()
        assert final.cost_usd_accumulated == pytest.approx(0.20)
        assert final.aborted is False
