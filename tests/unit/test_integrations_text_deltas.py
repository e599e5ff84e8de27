"""The SDK transport's reading of Chat Completions text deltas by their text alone (pure):
whatever the events, a splitter with ``text_deltas`` hands on the same bytes, cuts the
stream at the same event and meters the same figures as one that decodes every event in
full (generated streams: many shapes, repeated and not, valid JSON or not); and the
common events of a stream do take the short way."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.context.call import Call
from coordinator.context.execution import ExecutionContext
from coordinator.core.usage import UsageCollector
from coordinator.integrations.errors import BudgetExceededError
from coordinator.integrations.exchange import Exchange
from coordinator.integrations.request_plan import plan_request
from coordinator.integrations.sse import EventSplitter, TextDelta
from tests.support.fake_provider import Served, _chat_stream

MARKER = "\ufdd0"  # the splitter's own marker, also as a text
TEXTS = st.one_of(st.text(max_size=12), st.sampled_from(
    ["", "abcd", 'a "quoted" \\ word', "\n", MARKER, "\u00e9\U0001f600", "content"]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), TEXTS)


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    """A Chat Completions chunk, common or not."""
    delta: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(
            ["role", "content", "content", "refusal", "reasoning_content", "tool_calls"]),
            max_size=4)):
        delta[name] = (draw(st.sampled_from([None, [], [{"function": {"arguments": "ab"}}]]))
                       if name == "tool_calls" else draw(SCALARS))
    choice = {"index": 0, "delta": draw(st.sampled_from([delta, delta, delta, None, "x"])),
              "finish_reason": draw(st.sampled_from([None, "stop"]))}
    chunk: dict[str, Any] = {"id": draw(st.sampled_from(["chatcmpl-1", "chatcmpl-2"])),
                             "object": "chat.completion.chunk", "created": 0}
    if draw(st.booleans()):
        chunk["model"] = draw(st.one_of(st.sampled_from(["gpt-4o", "gpt-4o-mini"]), SCALARS))
    chunk["choices"] = draw(st.sampled_from(
        [[choice], [choice], [choice], [], [choice, choice], None]))
    usage = draw(st.sampled_from([None, None, "absent", {"prompt_tokens": 7,
                                  "completion_tokens": 3}, {"completion_tokens": 2}]))
    if usage != "absent":
        chunk["usage"] = usage
    if draw(st.integers(0, 9)) == 0:
        chunk["type"] = "x"
    return chunk


@st.composite
def data_lines(draw: st.DrawFn, shapes: list[dict[str, Any]]) -> bytes:
    """One event's data: a chunk of the stream's shapes (or a new one) with a new text,
    spelt one way or another, sometimes tampered with."""
    reuse = bool(shapes) and draw(st.booleans())
    chunk = dict(draw(st.sampled_from(shapes))) if reuse else draw(chunks())
    ascii_only = draw(st.booleans())
    colon = draw(st.sampled_from([":", ": "]))
    choices, content = chunk.get("choices"), None
    if isinstance(choices, list) and choices and isinstance(choices[0].get("delta"), dict):
        content = draw(TEXTS)
        chunk["choices"] = [{**choices[0], "delta": {**choices[0]["delta"], "content": content}},
                            *choices[1:]]
    text = json.dumps(chunk, ensure_ascii=ascii_only,
                      separators=("," if colon == ":" else ", ", colon))
    tamper = draw(st.integers(0, 14))
    if tamper == 1:  # a second content key, before the first
        text = text.replace('"content"', f'"content"{colon}"zz", "content"', 1)
    elif tamper == 2 and content is not None:  # ... or after it
        pair = f'"content"{colon}{json.dumps(content, ensure_ascii=ascii_only)}'
        text = text.replace(pair, f'{pair}, "content"{colon}"zz"', 1)
    elif tamper == 10 and content is not None:  # ... spelling the marker with an escape
        pair = f'"content"{colon}{json.dumps(content, ensure_ascii=ascii_only)}'
        text = text.replace(pair, f'{pair}, "content"{colon}"\\ufdd0"', 1)
    elif tamper == 3:  # the key spelt with an escape
        text = text.replace('"content"', '"\\u0063ontent"', 1)
    elif tamper == 4:  # broken JSON
        text = text[:-1]
    elif tamper == 5:
        text = text.replace('"content":', '"content" :', 1)
    elif tamper == 6:
        return b"data: " + text.encode()[:-3] + b"\xff\"}"
    elif tamper == 7:
        return b"data: [DONE]"
    elif tamper == 8:  # the marker outside the text
        text = text.replace('"object"', f'"{MARKER}"', 1)
    elif tamper == 9:  # an escape outside the text
        text = text.replace('"chatcmpl-', '"chat\\u0063mpl-', 1)
    return b"data: " + text.encode()


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """A stream's events (each ending in a blank line), many of a few shapes."""
    shapes = draw(st.lists(chunks(), max_size=3))
    events = [draw(data_lines(shapes)) + draw(st.sampled_from([b"\n\n", b"\r\n\r\n"]))
              for _ in range(draw(st.integers(1, 30)))]
    if draw(st.booleans()):  # another event kind in between
        events.insert(draw(st.integers(0, len(events))), b'event: x\ndata: {"a": 1}\n\n')
    return events


def _exchange(model: str | None, max_tokens: int | None, held_usd: int) -> Exchange:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    if model is not None:
        body["model"] = model
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    plan = plan_request("POST", "/v1/chat/completions", json.dumps(body).encode())
    assert plan is not None
    ex = Exchange(cast(ExecutionContext, None), plan, BudgetExceededError)
    ex.call = cast(Call, SimpleNamespace(held={"usd": held_usd}, collector=UsageCollector(),
                                         model=plan.model))
    ex.start_stream()
    return ex


def _run(ex: Exchange, splitter: EventSplitter, pieces: list[bytes]) -> list[Any]:
    """What the transport hands on and when it cuts, then the meter's figures."""
    out: list[Any] = []
    try:
        for piece in pieces:
            passed, cut = ex.meter_chunk(splitter, piece)
            out.append((passed, cut))
            if cut:
                break
        out.append(splitter.rest())
    except Exception as exc:  # noqa: BLE001 - the same error either way
        out.append(type(exc))
    meter = ex.meter
    assert meter is not None
    out += [meter.usage(), meter.stated, meter.output_tokens, meter.input_tokens,
            meter.estimated_output, meter.anthropic, ex.stop_reason]
    return out


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=streams(), cuts=st.lists(st.integers(0, 4000), max_size=6),
       model=st.sampled_from([None, "gpt-4o"]), max_tokens=st.sampled_from([None, 3, 12]),
       held_usd=st.sampled_from([0, 60, 10**6]))
def test_both_readings_hand_on_cut_and_meter_the_same(
        events: list[bytes], cuts: list[int], model: str | None, max_tokens: int | None,
        held_usd: int) -> None:
    body = b"".join(events)
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    full = _run(_exchange(model, max_tokens, held_usd), EventSplitter(), pieces)
    short = _run(_exchange(model, max_tokens, held_usd), EventSplitter(text_deltas=True),
                 pieces)
    assert short == full


def test_a_common_stream_takes_the_short_way() -> None:
    events = _chat_stream({"stream_options": {"include_usage": True}},
                          Served("/v1/chat/completions", "gpt-4o", 200, True, 12, 20), False)
    splitter = EventSplitter(text_deltas=True)
    data = [e.data for chunk in events for e in splitter.feed(chunk)]
    assert [type(d) for d in data] == [TextDelta] * 21 + [dict, dict, type(None)]
    assert data[1] == TextDelta("gpt-4o", "abcd") and data[0] == TextDelta("gpt-4o", "")


def test_uncommon_shapes_take_the_full_decode() -> None:
    lines = [
        '{"model":"m","choices":[{"delta":{"content":"a","content":"b"}}]}',
        '{"model":"m","choices":[{"delta":{"content":"b","content":"a"}}]}',
        '{"model":"m","choices":[{"delta":{"\\u0063ontent":"a","content":"b"}}]}',
        '{"model":"m","choices":[{"delta":{"content":"a","refusal":"no"}}]}',
        '{"model":"m","choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}',
        '{"model":"m","choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}',
        '{"type":"x","choices":[{"delta":{"content":"a"}}]}',
        '{"model":"\ufdd0","choices":[{"delta":{"content":"a"}}]}',
    ]
    for line in lines:
        splitter = EventSplitter(text_deltas=True)
        for _ in range(2):  # a shape seen before, too
            (event,) = splitter.feed(f"data: {line}\n\n".encode())
            assert event.data == json.loads(line)
