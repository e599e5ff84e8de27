"""Metering of streamed provider responses: usage per chunk, a stop at the output limit,
and the usage left with the wrapped call however the stream ends.

``metered_stream(stream)`` wraps an iterator of chunks (``ametered_stream`` an async
one) in the OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and LiteLLM
streaming shapes, SDK objects or plain dicts.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Callable, Iterable
from types import TracebackType
from typing import Any, Literal

from ..core.usage import Usage, UsageMeter, current_collector
from ..errors import InvalidUsageError, TokenBudgetExceededError
from .call import active_call
from .cancellation import CancelledByContext
from .chunk_meter import ChunkMeter, estimate_tokens
from .execution import current_cancellation_token

OnLimit = Literal["stop", "raise"]


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
        self._meter = ChunkMeter(input_tokens, count_tokens or estimate_tokens, provider, model)
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
