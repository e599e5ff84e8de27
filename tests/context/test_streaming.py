"""Streamed responses: usage metered per chunk into a real wrapped call, a stop at the
output limit with the provider's stream closed (at most one chunk over), and the usage
settled however the stream ends (exhausted, stopped, dropped by the consumer, aborted)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from coordinator import (
    Decision,
    ExecutionConfig,
    ExecutionContext,
    TokenBudget,
    WrapOptions,
)
from coordinator.context.streaming import ametered_stream, estimate_tokens, metered_stream
from coordinator.errors import InvalidUsageError, TokenBudgetExceededError

CONFIG = ExecutionConfig(max_cost_usd=10.0, max_steps=100, max_retries_total=5)
WORDS = [f" w{i % 10}" for i in range(100)]  # 3 characters: one token each


class Source:
    """A provider stream: a generator that records how far it was read and whether the
    connection was closed."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.sent = 0
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        try:
            for event in self.events:
                self.sent += 1
                yield event
        finally:
            self.closed = True

    async def aiter(self) -> AsyncIterator[Any]:
        try:
            for event in self.events:
                self.sent += 1
                await asyncio.sleep(0)
                yield event
        finally:
            self.closed = True


class SdkStream:
    """Like the SDKs' ``Stream``: an iterator over an HTTP response that only ``close()``
    closes (dropping it does not)."""

    def __init__(self, events: list[Any]) -> None:
        self._events = iter(events)
        self.sent = 0
        self.closed = False

    def __iter__(self) -> SdkStream:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        event = next(self._events)
        self.sent += 1
        return event

    def close(self) -> None:
        self.closed = True


def openai_chunks(words: list[str], *, prompt: int = 57, cached: int = 0,
                  include_usage: bool = True, sdk: bool = False) -> list[Any]:
    """Chat Completions stream chunks as OpenAI sends them with
    ``stream_options={"include_usage": True}``."""
    base = {"id": "chatcmpl-AbC", "object": "chat.completion.chunk", "created": 1741570283,
            "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_f9f4fb6dbf"}
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}], "usage": None}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": w}, "logprobs": None,
                                     "finish_reason": None}], "usage": None} for w in words]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "stop"}], "usage": None})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": {
            "prompt_tokens": prompt, "completion_tokens": len(words),
            "total_tokens": prompt + len(words),
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}}})
    if sdk:
        return [ChatCompletionChunk.model_validate(c) for c in chunks]
    return chunks


def anthropic_events(words: list[str], *, input_tokens: int = 25, cache_read: int = 0,
                     output_tokens: int | None = None) -> list[Any]:
    """Messages stream events as the Anthropic SDK yields them (its own objects)."""
    events = [
        {"type": "message_start", "message": {
            "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message",
            "role": "assistant", "content": [], "model": "claude-sonnet-4-5-20250929",
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": cache_read, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "text_delta", "text": w}} for w in words),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": len(words) if output_tokens is None else output_tokens}},
        {"type": "message_stop"},
    ]
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    return [adapter.validate_python(e) for e in events]


def responses_events(words: list[str]) -> list[Any]:
    """OpenAI Responses API stream events (SDK objects)."""
    response = {"id": "resp_1", "object": "response", "created_at": 1741476777,
                "model": "gpt-4o-2024-08-06", "output": [], "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": []}
    events = [{"type": "response.created", "sequence_number": 0,
               "response": {**response, "status": "in_progress"}}]
    events += [{"type": "response.output_text.delta", "sequence_number": i + 1,
                "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": w,
                "logprobs": []} for i, w in enumerate(words)]
    events.append({"type": "response.completed", "sequence_number": len(words) + 1,
                   "response": {**response, "status": "completed", "usage": {
                       "input_tokens": 40, "output_tokens": len(words) + 2,
                       "total_tokens": 42 + len(words),
                       "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                       "output_tokens_details": {"reasoning_tokens": 2}}}})
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    return [adapter.validate_python(e) for e in events]


def litellm_chunks(words: list[str]) -> list[Any]:
    """LiteLLM ModelResponseStream chunks (attribute access) for an Anthropic model with
    stream_options include_usage: the final usage's prompt_tokens includes cache reads."""
    chunks = [SimpleNamespace(id="chatcmpl-x", object="chat.completion.chunk",
                              model="claude-sonnet-4-5-20250929",
                              choices=[SimpleNamespace(index=0, delta=SimpleNamespace(
                                  content=w, role="assistant", tool_calls=None),
                                  finish_reason=None)]) for w in words]
    usage = SimpleNamespace(prompt_tokens=1030, completion_tokens=len(words),
                            total_tokens=1030 + len(words),
                            prompt_tokens_details=SimpleNamespace(cached_tokens=1000),
                            cache_read_input_tokens=1000, cache_creation_input_tokens=0)
    chunks.append(SimpleNamespace(id="chatcmpl-x", object="chat.completion.chunk",
                                  model="claude-sonnet-4-5-20250929", choices=[], usage=usage))
    return chunks


def consume(stream: Any) -> str:
    text = []
    for chunk in stream:
        choices = getattr(chunk, "choices", None) if not isinstance(chunk, dict) \
            else chunk["choices"]
        for choice in choices or []:
            delta = choice["delta"] if isinstance(choice, dict) else choice.delta
            content = delta.get("content") if isinstance(delta, dict) else delta.content
            text.append(content or "")
        if getattr(chunk, "type", None) == "content_block_delta":
            text.append(chunk.delta.text)
        if getattr(chunk, "type", None) == "response.output_text.delta":
            text.append(chunk.delta)
    return "".join(text)


def run(ctx: ExecutionContext, fn: Any, **options: Any) -> Decision:
    return ctx.wrap_llm_call(fn, WrapOptions(**{"provider": "openai", **options}))


# -- whole streams: the provider's own count is what is charged --------------------------


@pytest.mark.parametrize("sdk", [False, True], ids=["dicts", "sdk-objects"])
def test_openai_stream_with_include_usage_charges_the_final_count(coord: object,
                                                                  sdk: bool) -> None:
    source = Source(openai_chunks(WORDS[:20], prompt=57, cached=32, sdk=sdk))
    seen: list[str] = []
    with ExecutionContext(CONFIG) as ctx:
        decision = run(ctx, lambda: seen.append(consume(metered_stream(iter(source)))),
                       input_tokens_estimate=60, max_output_tokens=100)
        snap = ctx.get_snapshot()
    assert decision == Decision.ALLOW
    assert seen == ["".join(WORDS[:20])]
    assert (snap.tokens.input, snap.tokens.output) == (57, 20)
    assert snap.tokens.by_provider["openai"].total == 77
    assert snap.tokens.reserved == 0
    assert source.closed


def test_anthropic_stream_charges_message_start_input_and_message_delta_output(
        coord: object) -> None:
    # The provider's final count (30) differs from the text estimate (10 chunks): it wins.
    source = Source(anthropic_events(WORDS[:10], input_tokens=25, cache_read=400,
                                     output_tokens=30))
    with ExecutionContext(CONFIG) as ctx:
        streams: list[Any] = []

        def call() -> None:
            stream = metered_stream(iter(source))
            streams.append(stream)
            consume(stream)

        run(ctx, call, provider="anthropic", input_tokens_estimate=500, max_output_tokens=64)
        snap = ctx.get_snapshot()
    usage = streams[0].usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (425, 400)
    assert usage.model == "claude-sonnet-4-5-20250929"
    assert (snap.tokens.input, snap.tokens.output) == (425, 30)
    assert snap.tokens.by_provider["anthropic"].output == 30


def test_responses_api_and_litellm_streams_charge_their_final_usage(coord: object) -> None:
    with ExecutionContext(CONFIG) as ctx:
        run(ctx, lambda: consume(metered_stream(iter(responses_events(WORDS[:8])))),
            input_tokens_estimate=50, max_output_tokens=64)
        after_responses = ctx.get_snapshot().tokens
        run(ctx, lambda: consume(metered_stream(iter(litellm_chunks(WORDS[:5])))),
            provider="anthropic", input_tokens_estimate=2000, max_output_tokens=64)
        snap = ctx.get_snapshot()
    assert (after_responses.input, after_responses.output) == (40, 10)
    # LiteLLM's prompt_tokens already holds the 1000 cache reads: not added again.
    assert snap.tokens.by_provider["anthropic"].input == 1030
    assert snap.tokens.by_provider["anthropic"].output == 5
    assert (snap.tokens.input, snap.tokens.output) == (1070, 15)


# -- stopping at the limit ---------------------------------------------------------------


def test_stream_stops_at_max_output_tokens_and_closes_the_provider_stream(
        coord: object) -> None:
    source = SdkStream(openai_chunks(WORDS, sdk=True))  # 100 tokens on offer
    streams: list[Any] = []
    with ExecutionContext(CONFIG) as ctx:
        def call() -> str:
            stream = metered_stream(source, max_output_tokens=10, input_tokens=57)
            streams.append(stream)
            return consume(stream)

        decision = run(ctx, call, input_tokens_estimate=57, max_output_tokens=10)
        snap = ctx.get_snapshot()
    assert decision == Decision.ALLOW
    assert streams[0].stop_reason == "max_output_tokens"
    assert source.closed
    assert source.sent == 11  # the role chunk and ten one-token chunks, nothing more read
    # No final usage came: the input estimate and the counted output are charged.
    assert (snap.tokens.input, snap.tokens.output) == (57, 10)


def test_inside_a_wrap_the_call_reservation_is_the_default_limit(coord: object) -> None:
    source = SdkStream(openai_chunks(WORDS))  # 100 tokens on offer, no usage stated early
    streams: list[Any] = []
    with ExecutionContext(CONFIG) as ctx:
        def call() -> None:
            streams.append(metered_stream(source))
            consume(streams[0])

        run(ctx, call, input_tokens_estimate=57, max_output_tokens=12)
        run(ctx, lambda: consume(metered_stream(iter(openai_chunks(WORDS[:30])))),
            input_tokens_estimate=57)  # no max_output_tokens: no limit
        snap = ctx.get_snapshot()
    assert streams[0].stop_reason == "max_output_tokens" and source.closed
    assert [(n.input_tokens, n.output_tokens) for n in snap.nodes] == [(57, 12), (57, 30)]


def test_overshoot_is_at_most_one_chunk() -> None:
    chunks = openai_chunks(["abcdefghijkl"] * 20, include_usage=False)  # 3 tokens a chunk
    stream = metered_stream(iter(chunks), max_output_tokens=10)
    got = list(stream)
    assert len(got) == 1 + 4  # role chunk + 4 chunks: 12 tokens, the 4th crossed 10
    assert stream.usage.output_tokens == 12
    assert stream.usage.output_tokens - 10 < estimate_tokens("abcdefghijkl")


def test_limit_of_zero_reads_nothing() -> None:
    source = Source(openai_chunks(WORDS))
    stream = metered_stream(iter(source), output_allowance=lambda: 0)
    assert list(stream) == []
    assert source.sent == 0 and stream.stop_reason == "output_allowance"


def test_shrinking_allowance_is_re_read_before_every_chunk(coord: object) -> None:
    allowance = {"left": 1000}
    source = Source(openai_chunks(WORDS))

    def on_chunk(stream: Any) -> None:
        for i, _ in enumerate(stream):
            if i == 5:  # a sibling spent the rest of the tree's output allowance
                allowance["left"] = 8

    with ExecutionContext(CONFIG) as ctx:
        streams: list[Any] = []

        def call() -> None:
            streams.append(metered_stream(iter(source), output_allowance=lambda: allowance[
                "left"]))
            on_chunk(streams[0])

        run(ctx, call, input_tokens_estimate=57, max_output_tokens=100)
        snap = ctx.get_snapshot()
    assert streams[0].stop_reason == "output_allowance"
    assert snap.tokens.output == 8 and source.closed


def test_on_limit_raise_raises_token_budget_exceeded_after_charging(coord: object) -> None:
    errors: list[BaseException] = []
    with ExecutionContext(CONFIG) as ctx:
        def call() -> None:
            try:
                consume(metered_stream(iter(openai_chunks(WORDS)), max_output_tokens=7,
                                       on_limit="raise", input_tokens=57))
            except TokenBudgetExceededError as exc:
                errors.append(exc)
                raise

        run(ctx, call, input_tokens_estimate=57, max_output_tokens=7)
        snap = ctx.get_snapshot()
    assert len(errors) == 1
    assert "7 output tokens" in str(errors[0]) and "max_output_tokens is 7" in str(errors[0])
    assert snap.tokens.output == 7  # what was streamed is charged even though fn raised


def test_token_budget_is_never_exceeded_by_streams_stopped_at_their_reservation(
        coord: object) -> None:
    config = CONFIG.model_copy(update={"token_budget": TokenBudget(output=25)})
    decisions = []
    with ExecutionContext(config) as ctx:
        for _ in range(4):  # each stream offers 100 tokens; each call reserves 10
            decisions.append(run(ctx, lambda: consume(metered_stream(
                iter(openai_chunks(WORDS)), max_output_tokens=10)), max_output_tokens=10))
        snap = ctx.get_snapshot()
    assert decisions[:2] == [Decision.ALLOW, Decision.ALLOW]
    assert Decision.HALT in decisions[2:]
    assert snap.tokens.output == 20 <= 25


# -- consumers that stop early, cancellation, async --------------------------------------


def test_consumer_breaking_out_closes_the_stream_and_the_usage_is_settled(
        coord: object) -> None:
    source = SdkStream(anthropic_events(WORDS, input_tokens=80))
    with ExecutionContext(CONFIG) as ctx:
        def call() -> None:
            for i, _ in enumerate(metered_stream(source)):
                if i == 6:  # message_start, content_block_start, 5 text chunks
                    break
            assert source.closed  # dropped by the loop: the connection is closed now

        decision = run(ctx, call, provider="anthropic", input_tokens_estimate=100,
                       max_output_tokens=200)
        snap = ctx.get_snapshot()
    assert decision == Decision.ALLOW
    assert source.sent == 7
    # message_start's input count, and 1 stated + 5 streamed output tokens.
    assert (snap.tokens.input, snap.tokens.output) == (80, 6)


def test_a_chunk_with_impossible_usage_closes_the_stream_and_is_charged_its_estimate(
        coord: object) -> None:
    chunks = openai_chunks(WORDS[:5])
    chunks[-1]["usage"]["completion_tokens"] = -5
    source = Source(chunks)
    with ExecutionContext(CONFIG) as ctx:
        def call() -> None:
            for _ in metered_stream(iter(source)):
                pass

        with pytest.raises(InvalidUsageError):
            run(ctx, call, input_tokens_estimate=100, max_output_tokens=200)
        snap = ctx.get_snapshot()
    assert source.closed
    # the run raised (a retry) and is charged its estimate, not what the stream showed
    assert snap.retries_used == 1 and snap.tokens.reserved == 0
    assert (snap.tokens.input, snap.tokens.output) == (100, 200)


def test_context_manager_closes_on_exit() -> None:
    source = Source(openai_chunks(WORDS))
    with metered_stream(iter(source)) as stream:
        next(stream)
        next(stream)
    assert source.closed and source.sent == 2
    assert list(stream) == []


def test_abort_stops_a_stream_with_cancelled_and_charges_what_was_streamed(
        coord: object) -> None:
    source = Source(openai_chunks(WORDS))
    raised: list[BaseException] = []
    with ExecutionContext(CONFIG) as ctx:
        def call() -> None:
            try:
                for i, _ in enumerate(metered_stream(iter(source), input_tokens=57)):
                    if i == 3:
                        ctx.abort("operator stop")
            except BaseException as exc:
                raised.append(exc)
                raise

        decision = run(ctx, call, input_tokens_estimate=57, max_output_tokens=100)
        snap = ctx.get_snapshot()
    assert decision == Decision.HALT
    assert type(raised[0]).__name__ == "CancelledByContext"
    assert source.closed and source.sent == 4
    assert snap.tokens.output == 3 and snap.aborted


def test_async_stream_metered_in_awrap_and_closed_when_stopped(coord: object) -> None:
    source = Source(openai_chunks(WORDS))

    async def main() -> tuple[Decision, Any]:
        async with ExecutionContext(CONFIG) as ctx:
            async def call() -> int:
                n = 0
                async for _ in ametered_stream(source.aiter(), max_output_tokens=12,
                                               input_tokens=57):
                    n += 1
                return n

            decision = await ctx.awrap_llm_call(call, WrapOptions(
                provider="openai", input_tokens_estimate=57, max_output_tokens=12))
            return decision, ctx.get_snapshot()

    decision, snap = asyncio.run(main())
    assert decision == Decision.ALLOW
    assert source.closed and source.sent == 13
    assert (snap.tokens.input, snap.tokens.output) == (57, 12)


def test_async_stream_exhausted_charges_the_final_usage() -> None:
    async def main() -> Any:
        stream = ametered_stream(Source(anthropic_events(WORDS[:4], output_tokens=9)).aiter())
        events = [e async for e in stream]
        return events, stream

    events, stream = asyncio.run(main())
    assert len(events) == 4 + 5
    assert (stream.usage.input_tokens, stream.usage.output_tokens) == (25, 9)
    assert stream.stop_reason is None


def test_outside_a_wrapped_call_it_only_limits() -> None:
    stream = metered_stream(iter(openai_chunks(WORDS[:3], prompt=11)))
    assert consume(stream) == "".join(WORDS[:3])
    assert (stream.usage.input_tokens, stream.usage.output_tokens) == (11, 3)


def test_custom_token_counter_and_bad_arguments() -> None:
    stream = metered_stream(iter(openai_chunks(WORDS, include_usage=False)),
                            max_output_tokens=10, count_tokens=lambda text: 5)
    assert len(list(stream)) == 1 + 2
    for bad in ({"max_output_tokens": -1}, {"input_tokens": 1.5}, {"on_limit": "explode"}):
        with pytest.raises(InvalidUsageError):
            metered_stream(iter([]), **bad)


def test_tool_call_arguments_and_thinking_count_as_output() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    anthropic = [adapter.validate_python(e) for e in (
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "Let me think"}},  # 3 tokens
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM" * 10}},  # none
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}},  # 5
    )]
    stream = metered_stream(iter(anthropic))
    assert len(list(stream)) == 3 and stream.usage.output_tokens == 3 + 5
    openai = [{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":'}}]}}]},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {
            "tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}}]}]
    stream = metered_stream(iter(openai))
    assert len(list(stream)) == 2 and stream.usage.output_tokens == 2 + 3
