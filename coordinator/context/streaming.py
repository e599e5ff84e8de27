"""Metering of streamed provider responses: usage per chunk, a stop at the output limit,
and the usage left with the wrapped call however the stream ends.

``metered_stream(stream)`` wraps an iterator of chunks (``ametered_stream`` an async
one) in the OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and LiteLLM
streaming shapes, SDK objects or plain dicts.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterable, Callable, Iterable
from types import TracebackType
from typing import Any, Literal

from ..core.usage import Usage, UsageMeter, count, current_collector, field, tokens_from_usage
from ..errors import InvalidUsageError, TokenBudgetExceededError
from .call import active_call
from .cancellation import CancelledByContext
from .execution import current_cancellation_token

OnLimit = Literal["stop", "raise"]
# Responses API delta events that carry generated text (audio deltas are base64, not text).
_TEXT_DELTAS = ("text.delta", "refusal.delta", "arguments.delta")
# Where each Anthropic content delta carries its text (signature deltas carry none).
_ANTHROPIC_DELTA_TEXT = {"text_delta": "text", "input_json_delta": "partial_json",
                         "thinking_delta": "thinking"}
_RESPONSE_DONE = ("response.completed", "response.incomplete", "response.failed")


def estimate_tokens(text: str) -> int:
    """Output tokens of a chunk of text, on the high side: about four characters a token,
    and at least one (OpenAI streams about one token per chunk)."""
    return max(1, math.ceil(len(text) / 4))


class _Meter:
    """Usage of one stream from its chunks: stated by the provider where it says so,
    estimated from the text in between."""

    def __init__(self, input_tokens: int | None, count_tokens: Callable[[str], int],
                 provider: str | None, model: str | None) -> None:
        self.input_estimate = input_tokens
        self.count_tokens = count_tokens
        self.provider = provider
        self.model = model
        self.stated: Usage | None = None  # the provider's latest full count
        # Anthropic reports its counters apart (message_start, then message_delta).
        self.anthropic: dict[str, int] = {}
        self.estimated_output = 0  # text tokens seen since the last stated output count

    def observe(self, chunk: Any) -> None:
        kind = field(chunk, "type")
        if kind == "message_start":
            message = field(chunk, "message")
            self._anthropic(field(message, "usage"))
            self._model(field(message, "model"))
        elif kind == "message_delta":
            self._anthropic(field(chunk, "usage"))
        elif kind == "content_block_delta":
            delta = field(chunk, "delta")
            name = _ANTHROPIC_DELTA_TEXT.get(field(delta, "type"))
            if name is not None:
                self._text(field(delta, name))
        elif isinstance(kind, str) and kind in _RESPONSE_DONE:
            response = field(chunk, "response")
            self._model(field(response, "model"))
            self._stated(field(response, "usage"))
        elif isinstance(kind, str) and kind.startswith("response."):
            if kind.endswith(_TEXT_DELTAS):
                self._text(field(chunk, "delta"))
        else:  # Chat Completions chunk (OpenAI, LiteLLM, OpenAI-compatible servers)
            self._model(field(chunk, "model"))
            for choice in field(chunk, "choices") or ():
                delta = field(choice, "delta")
                if delta is None:
                    continue
                for name in ("content", "refusal", "reasoning_content"):
                    self._text(field(delta, name))
                for call in field(delta, "tool_calls") or ():
                    self._text(field(field(call, "function"), "arguments"))
            self._stated(field(chunk, "usage"))

    def _model(self, model: Any) -> None:
        if isinstance(model, str) and model and self.model is None:
            self.model = model

    def _text(self, text: Any) -> None:
        if isinstance(text, str) and text:
            self.estimated_output += self.count_tokens(text)

    def _stated(self, usage: Any) -> None:
        if usage is None:
            return
        tokens = tokens_from_usage(usage)
        if tokens.has_tokens:
            self.stated = tokens
            self.estimated_output = 0

    def _anthropic(self, usage: Any) -> None:
        if usage is None:
            return
        # message_delta counts are cumulative: each stated value replaces the last one.
        for name in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                     "cache_creation_input_tokens"):
            value = count(field(usage, name))
            if value is not None:
                self.anthropic[name] = value
        if "output_tokens" in self.anthropic:
            self.estimated_output = 0
        a = self.anthropic
        self.stated = tokens_from_usage({
            "input_tokens": a.get("input_tokens", 0), "output_tokens": a.get("output_tokens", 0),
            "cache_read_input_tokens": a.get("cache_read_input_tokens", 0),
            "cache_creation_input_tokens": a.get("cache_creation_input_tokens", 0)})

    @property
    def output_tokens(self) -> int:
        return (self.stated.output_tokens if self.stated else 0) + self.estimated_output

    def usage(self) -> Usage:
        stated = self.stated
        if stated is not None and stated.input_tokens:
            inp, cread, cwrite = (stated.input_tokens, stated.cache_read_input_tokens,
                                  stated.cache_creation_input_tokens)
        else:
            inp, cread, cwrite = self.input_estimate or 0, 0, 0
        return Usage(input_tokens=inp, output_tokens=self.output_tokens, model=self.model,
                     provider=self.provider, cache_read_input_tokens=cread,
                     cache_creation_input_tokens=cwrite)


class _Base:
    """What the sync and async streams share: the meter, the limits, the stop reason."""

    def __init__(
        self,
        source: Any,
        *,
        max_output_tokens: int | None,
        output_allowance: Callable[[], int | None] | None,
        input_tokens: int | None,
        provider: str | None,
        model: str | None,
        on_limit: OnLimit,
        count_tokens: Callable[[str], int] | None,
    ) -> None:
        call = active_call.get()
        if call is not None:
            # The wrap's reservation is the stream's worst case: stopping there means zero
            # overshoot; its input estimate stands in until the provider states the input.
            if max_output_tokens is None and call.options.max_output_tokens:
                max_output_tokens = call.options.max_output_tokens
            if input_tokens is None:
                input_tokens = call.options.input_tokens_estimate
        for name, value in (("max_output_tokens", max_output_tokens),
                            ("input_tokens", input_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise InvalidUsageError(f"{name} must be a non-negative integer; got {value!r}")
        if on_limit not in ("stop", "raise"):
            raise InvalidUsageError(f"on_limit must be 'stop' or 'raise'; got {on_limit!r}")
        self._source = source
        self._max_output = max_output_tokens
        self._allowance = output_allowance
        self._on_limit = on_limit
        self._meter = _Meter(input_tokens, count_tokens or estimate_tokens, provider, model)
        collector = current_collector()
        self._sink: UsageMeter | None = collector.meter() if collector is not None else None
        self._token = current_cancellation_token()
        self._closed = False
        self._limit: tuple[str, int] | None = None
        self._cancel_reason = "cancelled"
        self.stop_reason: str | None = None
        """None while running and after a normal end; ``max_output_tokens``,
        ``output_allowance`` or ``cancelled`` when the helper stopped the stream."""

    @property
    def usage(self) -> Usage:
        """The stream's usage so far (the provider's count once stated)."""
        return self._meter.usage()

    def _record(self, chunk: Any) -> None:
        self._meter.observe(chunk)
        if self._sink is not None:
            self._sink.set(self._meter.usage())

    def _limit_reached(self) -> tuple[str, int] | None:
        """The limit the stream's output has reached, if any: (name, limit)."""
        produced = self._meter.output_tokens
        if self._max_output is not None and produced >= self._max_output:
            return "max_output_tokens", self._max_output
        if self._allowance is not None:
            allowed = self._allowance()
            if allowed is not None and produced >= allowed:
                return "output_allowance", allowed
        return None

    def _cancelled(self) -> str | None:
        token = self._token
        return (token.reason or "cancelled") if token is not None and token.cancelled else None

    def _stop_error(self) -> BaseException:
        """What ends the iteration once the helper stopped the stream."""
        if self.stop_reason == "cancelled":
            return CancelledByContext(self._cancel_reason)
        if self._limit is not None and self._on_limit == "raise":
            name, limit = self._limit
            return TokenBudgetExceededError(
                f"stream stopped at {self._meter.output_tokens} output tokens: "
                f"{name} is {limit}")
        return StopIteration()


class MeteredStream(_Base):
    """A streamed response that meters its usage into the wrapped call and stops at the
    output limit (see :func:`metered_stream`). Iterate it, or use it as a context manager;
    ``close()`` closes the provider's stream."""

    def __init__(self, source: Iterable[Any], **options: Any) -> None:
        super().__init__(source, **options)
        self._it = iter(source)

    def __iter__(self) -> MeteredStream:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise self._stop_error()
        reason = self._cancelled()
        if reason is not None:
            self._stop("cancelled", reason)
            raise self._stop_error()
        self._limit = self._limit_reached()
        if self._limit is not None:
            self._stop(self._limit[0])
            raise self._stop_error()
        try:
            chunk = next(self._it)
            self._record(chunk)  # a chunk stating impossible usage raises InvalidUsageError
        except BaseException:
            self.close()
            raise
        self._limit = self._limit_reached()
        if self._limit is not None:
            # Stop the provider now (it bills what it generates); hand on this chunk.
            self._stop(self._limit[0])
        return chunk

    def _stop(self, reason: str, cancel_reason: str = "cancelled") -> None:
        self.stop_reason = reason
        self._cancel_reason = cancel_reason
        self.close()

    def close(self) -> None:
        """Close the provider's stream (idempotent). The usage stays with the call."""
        if self._closed:
            return
        self._closed = True
        for target in (self._source, self._it):
            closer = getattr(target, "close", None)
            if callable(closer):
                closer()
                return

    def __enter__(self) -> MeteredStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        # A consumer that breaks out of its loop drops the stream: close the connection.
        if not getattr(self, "_closed", True):
            self.close()


class AsyncMeteredStream(_Base):
    """The async twin of :class:`MeteredStream` (``async for``, ``async with``,
    ``await aclose()``)."""

    def __init__(self, source: AsyncIterable[Any], **options: Any) -> None:
        super().__init__(source, **options)
        self._it = source.__aiter__()

    def __aiter__(self) -> AsyncMeteredStream:
        return self

    async def __anext__(self) -> Any:
        if not self._closed:
            reason = self._cancelled()
            if reason is not None:
                await self._stop("cancelled", reason)
            else:
                self._limit = self._limit_reached()
                if self._limit is not None:
                    await self._stop(self._limit[0])
        if self._closed:
            raise _async_stop(self._stop_error())
        try:
            chunk = await self._it.__anext__()
            self._record(chunk)  # a chunk stating impossible usage raises InvalidUsageError
        except BaseException:
            await self.aclose()
            raise
        self._limit = self._limit_reached()
        if self._limit is not None:
            await self._stop(self._limit[0])
        return chunk

    async def _stop(self, reason: str, cancel_reason: str = "cancelled") -> None:
        self.stop_reason = reason
        self._cancel_reason = cancel_reason
        await self.aclose()

    async def aclose(self) -> None:
        """Close the provider's stream (idempotent). The usage stays with the call."""
        if self._closed:
            return
        self._closed = True
        for target in (self._source, self._it):
            closer = getattr(target, "aclose", None) or getattr(target, "close", None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    await result
                return

    async def __aenter__(self) -> AsyncMeteredStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


def _async_stop(error: BaseException) -> BaseException:
    return StopAsyncIteration() if isinstance(error, StopIteration) else error


def metered_stream(
    stream: Iterable[Any],
    *,
    max_output_tokens: int | None = None,
    output_allowance: Callable[[], int | None] | None = None,
    input_tokens: int | None = None,
    provider: str | None = None,
    model: str | None = None,
    on_limit: OnLimit = "stop",
    count_tokens: Callable[[str], int] | None = None,
) -> MeteredStream:
    """Meter a streamed provider response inside a wrapped call.

    After every chunk the stream's usage so far goes to the wrapped call (the provider's
    count where it states one: OpenAI's final ``include_usage`` chunk, Anthropic's
    ``message_start``/``message_delta``, the Responses ``response.completed`` event;
    otherwise the input estimate ``input_tokens`` and an estimate of the text seen, by
    ``count_tokens``), so the call settles with it however the stream ends: exhausted,
    stopped here, or dropped by a consumer that broke out of its loop.

    Inside a wrapped call, ``max_output_tokens`` and ``input_tokens`` default to the
    call's ``WrapOptions.max_output_tokens`` (its reservation) and
    ``input_tokens_estimate``. The stream stops, and the provider's stream is closed, as
    soon as its output reaches ``max_output_tokens`` or what ``output_allowance()``
    returns (re-read before every chunk, so keep it cheap; None = no limit): the chunk
    that reached it is the last one handed on (at most one chunk over).
    ``on_limit="raise"`` then raises :class:`~coordinator.errors.TokenBudgetExceededError`
    instead of ending quietly (``stop_reason`` says why it ended). When the wrapped call
    is cancelled (abort, timeout), the stream is closed and ``CancelledByContext`` raised.

    Outside a wrapped call the stream is only limited; its usage is on ``.usage``.
    """
    return MeteredStream(stream, max_output_tokens=max_output_tokens,
                         output_allowance=output_allowance, input_tokens=input_tokens,
                         provider=provider, model=model, on_limit=on_limit,
                         count_tokens=count_tokens)


def ametered_stream(
    stream: AsyncIterable[Any],
    *,
    max_output_tokens: int | None = None,
    output_allowance: Callable[[], int | None] | None = None,
    input_tokens: int | None = None,
    provider: str | None = None,
    model: str | None = None,
    on_limit: OnLimit = "stop",
    count_tokens: Callable[[str], int] | None = None,
) -> AsyncMeteredStream:
    """:func:`metered_stream` for an async stream (``async for chunk in ...``)."""
    return AsyncMeteredStream(stream, max_output_tokens=max_output_tokens,
                              output_allowance=output_allowance, input_tokens=input_tokens,
                              provider=provider, model=model, on_limit=on_limit,
                              count_tokens=count_tokens)
