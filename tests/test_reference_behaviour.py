"""Where the specifications are silent, behave like the reference ExecutionContext
(veronica-core 3.10): a bounded pipeline event list, frozen models that raise an
AttributeError, chain-level stops recorded once per reason, manual cost propagation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    SafetyEvent,
    ShieldPipeline,
    TokenBudget,
    ToolCallContext,
    WrapOptions,
)
from coordinator.errors import FrozenModelError
from coordinator.pipeline import MAX_EVENTS


def config(**kw: object) -> ExecutionConfig:
    base: dict[str, object] = {"max_cost_usd": 1.0, "max_steps": 100, "max_retries_total": 5}
    return ExecutionConfig(**{**base, **kw})


def event(i: int) -> SafetyEvent:
    return SafetyEvent(event_type="x", decision=Decision.HALT, reason=str(i), hook="t")


# -- 5. the pipeline's events ------------------------------------------------------------


def test_pipeline_keeps_the_last_thousand_events() -> None:
    pipeline = ShieldPipeline()
    for i in range(MAX_EVENTS + 500):
        pipeline.record(event(i))
    kept = pipeline.get_events()
    assert MAX_EVENTS == 1000
    assert [e.reason for e in kept] == [str(i) for i in range(500, 1500)]
    news, position = pipeline.events_since(1498)
    assert [e.reason for e in news] == ["1498", "1499"] and position == 1500
    assert pipeline.events_since(position) == ([], 1500)


class _NoCopies(ShieldPipeline):
    """A pipeline whose whole event list must not be copied."""

    def get_events(self) -> list[SafetyEvent]:
        raise AssertionError("a wrap copied the pipeline's whole event list")


class _Deny:
    def before_llm_call(self, ctx: ToolCallContext) -> Decision:
        return Decision.HALT


def test_a_wrap_does_not_copy_the_pipeline_events(coord: Coordinator) -> None:
    pipeline = _NoCopies(_Deny())
    with ExecutionContext(config(), pipeline) as ctx:
        for _ in range(3):
            assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        events = ctx.get_snapshot().events
    assert [e.hook for e in events] == ["_Deny"] * 3  # each event mirrored once


def test_a_context_mirrors_events_past_the_cap(coord: Coordinator) -> None:
    pipeline = ShieldPipeline(_Deny())
    meta = ChainMetadata(request_id="r", chain_id="past-cap")
    with ExecutionContext(config(), pipeline, meta) as ctx:
        for i in range(MAX_EVENTS - 1):
            pipeline.record(event(i))
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT  # the 1000th event
        for i in range(10):
            pipeline.record(event(MAX_EVENTS + i))
        assert ctx.wrap_llm_call(lambda: None) == Decision.HALT
        events = ctx.get_snapshot().events
    # the chain's log in Redis has every event once, though the pipeline keeps 1000
    assert len(events) == MAX_EVENTS + 11
    assert [e.reason for e in events[-11:-1]] == [str(MAX_EVENTS + i) for i in range(10)]
    assert len(pipeline.get_events()) == MAX_EVENTS


# -- 7. frozen models --------------------------------------------------------------------


@pytest.mark.parametrize("model", [
    config(),
    ChainMetadata(request_id="r", chain_id="c"),
    WrapOptions(cost_estimate_hint=0.1),
    event(1),
    TokenBudget(total=10),
])
def test_mutating_a_frozen_model_raises_frozen_instance_error(model: Any) -> None:
    """The specifications' dataclasses raise dataclasses.FrozenInstanceError (an
    AttributeError); so do these models, and they stay unchanged."""
    name = next(iter(type(model).model_fields))
    before = model.model_dump()
    with pytest.raises(dataclasses.FrozenInstanceError) as info:
        setattr(model, name, None)
    assert isinstance(info.value, AttributeError)
    assert isinstance(info.value, FrozenModelError) and info.value.field == name
    with pytest.raises(AttributeError):
        delattr(model, name)
    with pytest.raises(AttributeError):
        model.not_a_field = 1
    assert model.model_dump() == before
    # copies with changes still work, as with dataclasses.replace
    assert model.model_copy(update={name: getattr(model, name)}) == model
