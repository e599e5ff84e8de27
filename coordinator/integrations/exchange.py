"""One budgeted HTTP request to an LLM endpoint, as the steps of a wrapped call (the
call's own ``begin``/``complete``/``fail`` generators, driven by the sync or the async
transport): the reservation from the request's plan, the settle from the response body or
the stream's events, the refusal raised as a typed error, the span of the call."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

import httpcore2

from ..context import tracing
from ..context.call import Call, Outcome, begin
from ..context.chunk_meter import ChunkMeter, estimate_tokens
from ..context.execution import ExecutionContext
from ..context.settling import complete, fail
from ..context.state import ContextState
from ..context.steps import Steps
from ..core import pricing
from ..core.usage import UsageMeter
from ..models import ContextSnapshot, Decision
from .errors import BudgetExceededError
from .request_plan import RequestPlan
from .sse import EventSplitter, TextDelta


class ProviderError(Exception):
    """A provider answered an LLM request with an error status (429, 5xx, ...): a failed
    call under the retry rules. The SDK still gets the response and raises its own error."""

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"provider answered HTTP {status}")


@dataclass
class Exchange:
    """The budget's side of one request, from its reservation to its settle."""

    ctx: ExecutionContext
    plan: RequestPlan
    error_class: type[BudgetExceededError]
    operation_name: str | None = None
    call: Call | None = None
    span: Any = None
    meter: ChunkMeter | None = None
    sink: UsageMeter | None = None
    finished: bool = False
    stop_reason: str | None = None
    """``output_allowance`` once a stream was cut at what the call holds."""
    outcome: Outcome | None = field(default=None, repr=False)
    price: pricing.ModelPrice | None = None
    held_usd: int = 0
    """What the call holds in USD, read once when its stream starts (0: not checked)."""

    @property
    def state(self) -> ContextState:
        return self.ctx._state

    def begin(self) -> Steps[Call | Outcome]:
        """Reserve the request's worst case (and consult the pipeline and breaker)."""
        options = self.plan.options(self.operation_name)
        self.span = tracing.start_span(self.state, "llm", options, self.plan.operation)
        result = yield from begin(self.state, self.ctx, "llm", options)
        if isinstance(result, Call):
            self.call = result
        else:
            self.finished = True
            self._end_span(result, None)
        return result

    def refusal(self, outcome: Outcome, snapshot: ContextSnapshot | None
                ) -> BudgetExceededError:
        """The typed error of a refused or stopped request."""
        return self.error_class(decision=outcome.decision,
                                reason=outcome.reason or outcome.decision.value.lower(),
                                detail=outcome.detail, chain_id=self.ctx.chain_id,
                                snapshot=snapshot)

    # -- streams ---------------------------------------------------------------------

    def start_stream(self) -> None:
        """Meter the events of a streamed response into the call's usage."""
        assert self.call is not None
        plan, model = self.plan, self.call.model  # (the model its ladder chose)
        self.meter = ChunkMeter(plan.input_tokens, estimate_tokens, plan.provider, model)
        self.sink = self.call.collector.meter()
        self.price = pricing.model_price(model, plan.provider)  # looked up once
        self.held_usd = self.call.held.get("usd", 0) if self.price is not None else 0

    def observe(self, data: Any) -> bool:
        """Meter one event (a dict, or a text delta read by its text alone); True when
        the stream must be cut here (its output reached what the call holds: the next
        chunk could pass the ceiling)."""
        meter = self.meter
        if meter is None or self.sink is None:
            return False
        # (the usage goes to the call when it settles: _metered)
        if type(data) is TextDelta:
            meter.observe_text(data.model, data.text)
        elif isinstance(data, dict):
            meter.observe(data)
        else:
            return False
        plan = self.plan
        produced = meter.output_tokens
        if produced > plan.max_output_tokens or (
                not plan.limit_named and produced >= plan.max_output_tokens):
            self.stop_reason = "output_allowance"
            return True
        held, price = self.held_usd, self.price
        if held and price is not None:
            # every input token at the full input rate: on the safe side of the real cost
            # (the meter's input: the stated count, else the plan's estimate)
            if meter.input_tokens * price.input_per_mtok + (
                    produced * price.output_per_mtok) > held:
                self.stop_reason = "output_allowance"
                return True
        return False

    def meter_chunk(self, splitter: EventSplitter, chunk: bytes) -> tuple[bytes, bool]:
        """Meter the events ``chunk`` completes: (their bytes, to hand on in one piece,
        up to the event the stream is cut at; whether it is cut there). The usage-only
        chunk the transport asked for is metered and not handed on (the caller's loop
        expects every chunk to carry a choice)."""
        passed = []
        hide_usage = self.plan.usage_added
        for event in splitter.feed(chunk):
            cut = self.observe(event.data)
            if not (hide_usage and _usage_only(event.data)):
                passed.append(event.raw)
            if cut:
                return b"".join(passed), True
        return b"".join(passed), False

    def _metered(self) -> None:
        """Hand the stream's usage so far to the call (before it settles)."""
        if self.meter is not None and self.sink is not None:
            self.sink.set(self.meter.usage())

    # -- the settle ------------------------------------------------------------------

    def complete(self, result: Any) -> Steps[Outcome]:
        """Settle what the response (or the stream's metered usage) says it used."""
        assert self.call is not None
        self.finished = True
        self._metered()
        outcome = yield from complete(self.call, result)
        self.outcome = outcome
        self._end_span(outcome, None)
        return outcome

    def fail(self, exc: BaseException) -> Steps[Outcome | None]:
        """Settle a request that failed (provider error, network error, abort)."""
        assert self.call is not None
        self.finished = True
        self._metered()
        outcome = yield from fail(self.call, exc)
        self.outcome = outcome
        self._end_span(outcome, exc)
        return outcome

    def _end_span(self, outcome: Outcome | None, error: BaseException | None) -> None:
        if self.span is None:
            return
        reason = (outcome.reason if outcome is not None else None) or self.stop_reason
        tracing.end_span(self.span, self.state,
                         decision=outcome.decision.value if outcome else "ERROR",
                         reason=reason, settled=self.call.settled if self.call else None,
                         error=error)

    def stops(self, outcome: Outcome | None) -> bool:
        """Whether a failed request's outcome stops it for good (the retry budget is
        spent, or it was aborted): the SDK must not retry it."""
        return outcome is not None and outcome.decision == Decision.HALT


def _usage_only(data: Any) -> bool:
    """Whether an event is a Chat Completions chunk that carries only the usage."""
    return type(data) is dict and data.get("choices") == [] and data.get("usage") is not None


def cut_connection(extensions: dict[str, Any]) -> None:
    """Shut the socket of an HTTP/1.1 response down (from any thread): the read waiting on
    it returns at once, and the provider sees the client gone. An HTTP/2 connection
    carries other requests too (of other trees, maybe): it is never cut, and the metered
    stream stops at its next read instead (MeteredBody)."""
    if extensions.get("http_version", b"HTTP/1.1") not in (b"HTTP/1.1", b"HTTP/1.0"):
        return
    stream = extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    # a socket.socket, or the asyncio.TransportSocket of an async client's connection
    shutdown = getattr(sock, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def cut_waiting(transport: object, extensions: dict[str, Any]) -> None:
    """Shut down the connection a request (named by its ``extensions``, the dict httpx2
    hands on to its connection pool) is waiting on for its response headers, when
    ``transport`` is an ``httpx2.HTTPTransport``: its pool is the one place that knows
    which connection serves the request. Only an HTTP/1.1 connection is cut (one request
    at a time); through any other transport or over HTTP/2, nothing is (the request ends
    when the provider answers or its timeout passes)."""
    pool = getattr(transport, "_pool", None)
    for waiting in list(getattr(pool, "_requests", ())):
        if getattr(waiting.request, "extensions", None) is extensions:
            connection = getattr(waiting.connection, "_connection", None)
            if isinstance(connection, httpcore2.HTTP11Connection):
                cut_connection({"network_stream": connection._network_stream})
