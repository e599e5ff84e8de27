"""Actual usage read from provider responses (OpenAI Chat Completions and Responses,
Anthropic Messages, LiteLLM), as dicts and as the SDKs' own objects, each input token
counted once; and report_usage inside a real wrapped call."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from coordinator import (
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
    report_usage,
)
from coordinator.core.pricing import clear_prices, set_price
from coordinator.core.usage import Usage, UsageCollector, tokens_from_usage, usage_from_response
from coordinator.errors import InvalidCostError, InvalidUsageError

CONFIG = ExecutionConfig(max_cost_usd=100.0, max_steps=100, max_retries_total=5)

CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                 "message": {"role": "assistant", "content": "Hello!", "refusal": None}}],
    "usage": {
        "prompt_tokens": 1117,
        "completion_tokens": 46,
        "total_tokens": 1163,
        "prompt_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 64,
                                  "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 12, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    },
    "service_tier": "default",
    "system_fingerprint": "fp_fc9f1d7035",
}

RESPONSES_API: dict[str, Any] = {
    "id": "resp_67ccd3a9da748190baa7f1570fe91ac6",
    "object": "response",
    "created_at": 1741476777,
    "status": "completed",
    "model": "gpt-4o-2024-08-06",
    "output": [{"type": "message", "id": "msg_67ccd3acc8d48190a77525dc6de64b4b",
                "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi", "annotations": []}]}],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 2328,
        "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 200},
        "output_tokens": 52,
        "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 2380,
    },
}

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "Hi! My name is Claude."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 21,
        "cache_creation_input_tokens": 1500,
        "cache_read_input_tokens": 3000,
        "output_tokens": 393,
    },
}


def litellm_response() -> SimpleNamespace:
    """The attribute shape of a LiteLLM ModelResponse for an Anthropic call: LiteLLM's
    prompt_tokens already includes the cache reads and writes it also lists."""
    usage = SimpleNamespace(
        prompt_tokens=4521, completion_tokens=393, total_tokens=4914,
        prompt_tokens_details=SimpleNamespace(cached_tokens=3000, cache_creation_tokens=1500),
        cache_creation_input_tokens=1500, cache_read_input_tokens=3000)
    return SimpleNamespace(id="chatcmpl-1", object="chat.completion",
                           model="claude-sonnet-4-5-20250929", usage=usage,
                           _hidden_params={"custom_llm_provider": "anthropic",
                                           "response_cost": 0.0123})


def test_openai_chat_completion_counts_cached_tokens_once() -> None:
    for response in (CHAT_COMPLETION, ChatCompletion.model_validate(CHAT_COMPLETION)):
        u = usage_from_response(response)
        assert u is not None
        assert (u.input_tokens, u.output_tokens) == (1117, 46)
        assert (u.cache_read_input_tokens, u.cache_creation_input_tokens) == (1024, 64)
        assert u.model == "gpt-4o-2024-08-06"
        assert u.cost_usd is None


def test_openai_responses_api_counts_cached_tokens_once() -> None:
    for response in (RESPONSES_API, Response.model_validate(RESPONSES_API)):
        u = usage_from_response(response)
        assert u is not None
        assert (u.input_tokens, u.output_tokens) == (2328, 52)
        assert (u.cache_read_input_tokens, u.cache_creation_input_tokens) == (2048, 200)


def test_anthropic_message_adds_cache_reads_and_writes_to_input() -> None:
    for response in (ANTHROPIC_MESSAGE, Message.model_validate(ANTHROPIC_MESSAGE)):
        u = usage_from_response(response)
        assert u is not None
        assert u.input_tokens == 21 + 1500 + 3000
        assert u.output_tokens == 393
        assert (u.cache_read_input_tokens, u.cache_creation_input_tokens) == (3000, 1500)
        assert u.model == "claude-sonnet-4-5-20250929"


def test_litellm_response_does_not_add_cache_tokens_twice_and_takes_its_cost() -> None:
    u = usage_from_response(litellm_response())
    assert u is not None
    assert u.input_tokens == 4521
    assert (u.cache_read_input_tokens, u.cache_creation_input_tokens) == (3000, 1500)
    assert u.cost_usd == pytest.approx(0.0123)
    # The provider slug is never guessed from the response: the wrap's option decides.
    assert u.provider is None


def test_responses_without_usage_and_junk_values_refused() -> None:
    assert usage_from_response(None) is None
    assert usage_from_response("text") is None
    assert usage_from_response({"text": "no usage here"}) is None
    assert usage_from_response({"usage": {"prompt_tokens": 0, "completion_tokens": 0}}) is None
    only_cost = usage_from_response({"cost_usd": 0.5})
    assert only_cost is not None and only_cost.cost_usd == 0.5 and not only_cost.has_tokens
    # a payload stating impossible amounts cannot be charged from: it is refused
    for junk in ({"prompt_tokens": True}, {"prompt_tokens": 5, "completion_tokens": -3},
                 {"input_tokens": "12"}, {"input_tokens": 1.5}, {"output_tokens": 10**30},
                 {"input_tokens": math.nan}):
        with pytest.raises(InvalidUsageError):
            tokens_from_usage(junk)
    for cost in (math.nan, -1, "0.5", 1e300):
        with pytest.raises(InvalidUsageError):
            usage_from_response({"cost_usd": cost, "usage": {"input_tokens": 5}})


def test_inconsistent_cache_breakdown_is_clamped_to_the_input() -> None:
    u = tokens_from_usage({"prompt_tokens": 100, "completion_tokens": 1,
                           "prompt_tokens_details": {"cached_tokens": 250}})
    assert (u.input_tokens, u.cache_read_input_tokens) == (100, 100)


def test_collector_adds_reports_and_replaces_meter_contributions() -> None:
    c = UsageCollector()
    assert c.usage is None
    c.add(Usage(input_tokens=10, output_tokens=1, model="m"))
    meter = c.meter()
    meter.set(Usage(input_tokens=5, output_tokens=40))
    meter.set(Usage(input_tokens=5, output_tokens=30, cache_read_input_tokens=2))
    c.add(Usage(cost_usd=0.25, output_tokens=2))
    u = c.usage
    assert u is not None
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (15, 33, 2)
    assert u.cost_usd == 0.25 and u.model == "m"


def test_report_usage_validates_and_needs_a_wrapped_call(coord: object) -> None:
    with pytest.raises(RuntimeError, match="outside a wrapped call"):
        report_usage(input_tokens=1)
    with ExecutionContext(CONFIG) as ctx:
        errors: list[Exception] = []

        def bad_reports() -> None:
            for kwargs in ({"input_tokens": -1}, {"output_tokens": 1.5},
                           {"cost_usd": math.inf},
                           {"input_tokens": 10, "cache_read_input_tokens": 11},
                           {"input_tokens": 10, "cache_read_input_tokens": 6,
                            "cache_creation_input_tokens": 5}):
                try:
                    report_usage(**kwargs)  # type: ignore[arg-type]
                except (InvalidCostError, InvalidUsageError) as exc:
                    errors.append(exc)
            report_usage(input_tokens=10, output_tokens=3, cache_read_input_tokens=10)

        assert ctx.wrap_llm_call(bad_reports, WrapOptions(provider="openai")) == Decision.ALLOW
        assert len(errors) == 5
        assert isinstance(errors[3], InvalidUsageError) and "exceed input_tokens" in str(
            errors[3])
        tokens = ctx.get_snapshot().tokens
    # Only the valid report was charged.
    assert (tokens.input, tokens.output, tokens.total) == (10, 3, 13)


def test_reports_add_up_inside_one_call(coord: object) -> None:
    with ExecutionContext(CONFIG) as ctx:
        def chunks() -> None:
            report_usage(input_tokens=100, provider="anthropic")
            for _ in range(5):
                report_usage(output_tokens=7)

        ctx.wrap_llm_call(chunks, WrapOptions(input_tokens_estimate=100, max_output_tokens=50,
                                              provider="anthropic"))
        snap = ctx.get_snapshot()
    assert (snap.tokens.input, snap.tokens.output) == (100, 35)
    assert snap.tokens.by_provider["anthropic"].total == 135
    assert snap.tokens.reserved == 0


def test_wrapped_call_returning_an_anthropic_message_charges_its_usage(coord: object) -> None:
    set_price("claude-sonnet-4-5-20250929", input_per_mtok=1000.0, output_per_mtok=2000.0)
    try:
        config = CONFIG.model_copy(update={"token_budget": TokenBudget(total=100_000)})
        with ExecutionContext(config) as ctx:
            message = Message.model_validate({**ANTHROPIC_MESSAGE, "usage": {
                "input_tokens": 21, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 393}})
            decision = ctx.wrap_llm_call(lambda: message, WrapOptions(
                provider="anthropic", input_tokens_estimate=100, max_output_tokens=1000))
            assert decision == Decision.ALLOW
            snap = ctx.get_snapshot()
    finally:
        clear_prices()
    assert (snap.tokens.input, snap.tokens.output) == (21, 393)
    assert snap.tokens.by_provider["anthropic"].output == 393
    # Priced from the tokens with the override: 21 * 1000/1e6 + 393 * 2000/1e6 USD.
    assert snap.cost_usd_accumulated == pytest.approx(0.021 + 0.786)
