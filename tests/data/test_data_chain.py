"""The causal chain (StepStarted, StepCompleted / StepFailed, CapabilityCall) and the
exposure of context data to wrapped tools."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    ExposurePolicy,
    WrapOptions,
    current_data_view,
)
from coordinator.data.chain import read_chain

CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)


def _events(ctx: ExecutionContext, kind: str | None = None) -> list[dict[str, Any]]:
    events = [e.model_dump(mode="json")
              for e in read_chain(Coordinator.default(), ctx.root_id, ctx.chain_id)]
    return [e for e in events if kind is None or e["event_type"] == kind]


def test_steps_record_started_and_completed_or_failed(coord: Coordinator) -> None:
    meta = ChainMetadata(request_id="r-1", chain_id="plan-1", plan_id="plan-7",
                         intent_ids=("intent-a", "intent-b"), parent_action_id="act-3")
    with ExecutionContext(CONFIG, metadata=meta) as plan:
        with plan.spawn_child(step_name="Fetch User") as ok:
            pass
        with pytest.raises(RuntimeError), plan.spawn_child(step_name="Send Email") as bad:
            raise RuntimeError("smtp down")
        plain = plan.spawn_child()
        plain.close()
    kinds = [e["event_type"] for e in _events(ok) if e["hook"] == "CausalChain"]
    assert kinds == ["StepStarted", "StepCompleted"]
    started = _events(ok, "StepStarted")[0]["metadata"]
    assert started["step_name"] == "Fetch User" and started["plan_id"] == "plan-7"
    assert started["intent_ids"] == ["intent-a", "intent-b"]
    assert started["parent_action_id"] == "act-3"
    assert started["parent_chain_id"] == plan.chain_id
    failed = _events(bad, "StepFailed")
    assert len(failed) == 1 and "smtp down" in failed[0]["metadata"]["error"]
    assert failed[0]["decision"] == "HALT"
    assert _events(bad, "StepCompleted") == []
    assert _events(plain) == []  # not a step
    # one stream for the tree, in order; the contexts' SafetyEvents are left alone
    tree = [(e.event_type, e.metadata["step_name"])
            for e in read_chain(Coordinator.default(), plan.root_id)]
    assert tree == [("StepStarted", "Fetch User"), ("StepCompleted", "Fetch User"),
                    ("StepStarted", "Send Email"), ("StepFailed", "Send Email")]
    assert all(e.hook != "CausalChain" for e in ok.get_snapshot().events)


def test_capability_call_records_digests_not_data(coord: Coordinator) -> None:
    secret = "s3cr3t-" * 100

    def render(doc_id: int, *, fmt: str) -> str:
        return secret + str(doc_id) + fmt

    with ExecutionContext(CONFIG) as ctx:
        ctx.wrap_tool_call(functools.partial(render, 42, fmt="pdf"),
                           WrapOptions(operation_name="doc:render"))
        ctx.wrap_tool_call(lambda: 1 / 0, WrapOptions(operation_name="math:div"))
        ctx.wrap_llm_call(lambda: "llm calls are not capabilities")
        calls = _events(ctx, "CapabilityCall")
    assert [c["metadata"]["operation"] for c in calls] == ["doc:render", "math:div"]
    ok, err = calls[0]["metadata"], calls[1]["metadata"]
    assert ok["args_size"] > 0 and len(ok["args_digest"]) == 64
    assert ok["result_size"] == len(json.dumps(secret + "42pdf"))
    assert secret not in json.dumps(calls)  # digests only, never the data
    assert err["error"] == "ZeroDivisionError" and err["args_digest"] is None
    assert calls[1]["decision"] == "RETRY"


# -- exposure ------------------------------------------------------------------------


def _view_in_tool(ctx: ExecutionContext, operation: str, tags: tuple[str, ...] = ()
                  ) -> Mapping[str, Any] | None:
    seen: list[Mapping[str, Any] | None] = []
    ctx.wrap_tool_call(lambda: seen.append(current_data_view()),
                       WrapOptions(operation_name=operation, tags=tags))
    return seen[0]


def test_exposure_is_off_by_default(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as ctx:
        ctx.data.set("secret", 1)
        assert _view_in_tool(ctx, "ccos.ai.summarise") is None
        ctx.data.set_exposure(ExposurePolicy(allow_ids=("ccos.ai.summarise",)))
        assert _view_in_tool(ctx, "ccos.ai.summarise") is None  # not enabled
        assert current_data_view() is None  # outside a wrapped call


def test_exposure_by_id_prefix_and_tag(coord: Coordinator) -> None:
    policy = ExposurePolicy(enabled=True, allow_ids=("app.user:get",),
                            allow_prefixes=("ccos.ai.",), allow_tags=("needs-context",))
    with ExecutionContext(CONFIG) as plan:
        plan.data.update({"user": {"id": 42}, "cost": 120})
        plan.data.set_exposure(policy)
        step = plan.spawn_child()  # the policy is inherited
        step.data.set("draft", ["x"])
        full = {"user": {"id": 42}, "cost": 120, "draft": ("x",)}
        assert _view_in_tool(step, "app.user:get") == full
        assert _view_in_tool(step, "ccos.ai.summarise") == full
        assert _view_in_tool(step, "tool.x", ("needs-context",)) == full
        assert _view_in_tool(step, "app.user:getx") is None
        assert _view_in_tool(step, "ccos.aix") is None
        assert _view_in_tool(step, "tool.x", ("other",)) is None
        view = _view_in_tool(step, "app.user:get")
        assert view is not None
        with pytest.raises(TypeError):
            view["user"]["id"] = 7  # type: ignore[index]
        # a step narrows what tools see; its subtree narrows further, never widens
        step.data.set_exposure(expose_keys=["user", "draft"])
        assert _view_in_tool(step, "app.user:get") == {"user": {"id": 42}, "draft": ("x",)}
        sub = step.spawn_child()
        sub.data.set_exposure(expose_keys=["user", "cost"])
        assert _view_in_tool(sub, "app.user:get") == {"user": {"id": 42}}
        # a nearer policy replaces the inherited one
        sub.data.set_exposure(ExposurePolicy(enabled=False))
        assert _view_in_tool(sub, "app.user:get") is None
        assert _view_in_tool(step, "app.user:get") is not None
        sub.close()
        step.close()


def test_exposure_policy_checks_its_fields() -> None:
    with pytest.raises(TypeError):
        ExposurePolicy(enabled=True, allow_ids="ccos.ai.x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ExposurePolicy(enabled=True, allow_tags=(1,))  # type: ignore[arg-type]
    assert ExposurePolicy(enabled=True, allow_prefixes=("",)).allows("x", ()) is False


def test_async_tool_calls_are_recorded_and_see_the_view(coord: Coordinator) -> None:
    import asyncio

    async def tool() -> dict[str, Any]:
        view = current_data_view()
        return {"saw": dict(view) if view is not None else None}

    with ExecutionContext(CONFIG) as ctx:
        ctx.data.set("k", 1)
        ctx.data.set_exposure(ExposurePolicy(enabled=True, allow_ids=("async.tool",)))
        d = asyncio.run(ctx.awrap_tool_call(tool, WrapOptions(operation_name="async.tool")))
        assert d == Decision.ALLOW
        calls = _events(ctx, "CapabilityCall")
    assert [c["metadata"]["operation"] for c in calls] == ["async.tool"]
    assert calls[0]["metadata"]["result_size"] == len(json.dumps({"saw": {"k": 1}},
                                                                  separators=(",", ":"),
                                                                  sort_keys=True))


def test_a_result_that_cannot_be_digested_still_settles(coord: Coordinator) -> None:
    class Weird:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    with ExecutionContext(CONFIG) as ctx:
        d = ctx.wrap_tool_call(lambda: Weird(), WrapOptions(operation_name="weird",
                                                             cost_estimate_hint=0.01))
        assert d == Decision.ALLOW
        assert ctx.get_snapshot().step_count == 1
        calls = _events(ctx, "CapabilityCall")
    assert calls[0]["metadata"]["operation"] == "weird"
    assert "result_digest" not in calls[0]["metadata"]
