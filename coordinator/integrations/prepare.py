"""What the sync and async transports share before and after the I/O: the settings, the
request rewritten for budgeting (usage asked of a stream, no compression of a stream, the
model its ladder chose),
the context a request runs in, a response body decoded for its usage."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

from ..context.execution import ExecutionContext, current_context
from .request_plan import RequestPlan, plan_request


@dataclass(frozen=True)
class TransportSettings:
    """How the transport budgets requests."""

    default_output_tokens: int | None = None
    """Output tokens reserved for a request that names no limit (``max_tokens``...).
    None: the model's documented output cap (16,384 for gpt-4o: about $0.16 held per
    call), so set it when calls name no limit. A stream is cut once its output reaches
    what was reserved."""
    require_context: bool = False
    """Refuse (``BudgetExceededError``, reason ``no_context``) an LLM request made
    outside any context, instead of sending it unbudgeted."""
    operation_name: str | None = None
    """The node label of every call (default: ``"<operation> <model>"``)."""

    def __post_init__(self) -> None:
        value = self.default_output_tokens
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"default_output_tokens must be a non-negative integer or "
                             f"None; got {value!r}")


def context_for(explicit: ExecutionContext | None) -> ExecutionContext | None:
    """The context a request runs in: the transport's own, else the current one."""
    return explicit if explicit is not None else current_context()


def prepare(request: httpx2.Request, settings: TransportSettings
            ) -> tuple[RequestPlan, httpx2.Request] | None:
    """The plan of an LLM request and the request to send (rebuilt when its body
    changed; a stream is asked uncompressed); None for any other request."""
    if request.method != "POST":
        return None
    try:
        content = request.content
    except httpx2.RequestNotRead:  # a streamed upload: not an LLM call's JSON body
        return None
    plan = plan_request(request.method, request.url.path, content,
                        default_output_tokens=settings.default_output_tokens)
    if plan is None:
        return None
    if not plan.usage_added and not plan.stream:
        return plan, request
    if not plan.usage_added and request.headers.get("content-length") == str(len(content)):
        # the body goes as it is: only the stream's encoding is asked for, in place
        request.headers["accept-encoding"] = "identity"  # events metered as they arrive
        return plan, request
    headers = [(k, v) for k, v in request.headers.multi_items()
               if k.lower() not in ("content-length", "accept-encoding")]
    if plan.stream:
        headers.append(("accept-encoding", "identity"))  # events metered as they arrive
    body = json.dumps(plan.body, separators=(",", ":")).encode() if plan.usage_added \
        else content
    rebuilt = httpx2.Request(request.method, request.url, headers=headers, content=body,
                             extensions=request.extensions)
    return plan, rebuilt


def with_model(request: httpx2.Request, plan: RequestPlan, model: str | None
               ) -> httpx2.Request:
    """The request to send for a call that runs on ``model`` (what its model ladder
    chose, docs/degrade.md): ``request`` itself when its body names that model, else
    the same request with ``model`` in its JSON body."""
    if model is None or model == plan.model:
        return request
    headers = [(k, v) for k, v in request.headers.multi_items()
               if k.lower() != "content-length"]
    body = json.dumps({**plan.body, "model": model}, separators=(",", ":")).encode()
    return httpx2.Request(request.method, request.url, headers=headers, content=body,
                          extensions=request.extensions)


def is_event_stream(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def parse_body(headers: httpx2.Headers, raw: bytes) -> Any:
    """The JSON of a response body (decompressed when it came compressed), or None."""
    if headers.get("content-encoding"):
        raw = httpx2.Response(200, headers=headers, content=raw).read()
    try:
        return json.loads(raw)
    except ValueError:
        return None


def rebuilt_response(response: httpx2.Response, raw: bytes) -> httpx2.Response:
    """The response handed to the SDK once its body was read here."""
    return httpx2.Response(response.status_code, headers=response.headers,
                           stream=httpx2.ByteStream(raw), extensions=response.extensions)
