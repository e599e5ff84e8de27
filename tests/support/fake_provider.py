"""A local OpenAI- and Anthropic-compatible provider for the integration tests: an ASGI
app (Starlette) under uvicorn (or hypercorn, for HTTP/2) on a free port, with Chat
Completions, Responses, Embeddings and Messages, non-streaming and SSE, tool calls,
429/500 on demand and a log of every request it answered (the request counter).

Behaviour is asked per request with headers (SDKs send them with ``extra_headers``):
``x-fake-status`` (answer that status), ``x-fake-fail-first`` + ``x-fake-key`` (fail the
first N requests of that key with 500, then answer), ``x-fake-completion`` (output
tokens; default min(max_tokens, 20)), ``x-fake-delay-ms`` (between stream chunks),
``x-fake-tool`` (answer with a tool call), ``x-fake-wait-ms`` (before the headers).
Prompt tokens are the characters of the request's message texts over 4 (always below the
transport's estimate). A request offering tools gets a call of the first one it has not
called yet.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import math
import socket
import threading
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from coordinator.embedded import free_port

CHUNK_TEXT = "abcd"
"""The text of every streamed chunk: one token by the transport's estimate."""


@dataclass
class Served:
    """One request the provider answered."""

    path: str
    model: str
    status: int
    stream: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks_sent: int = 0
    disconnected: bool = False
    stream_sha256: str = ""
    """The SHA-256 of a stream's whole body (every event it was to send)."""
    retry_count: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class FakeProvider:
    """The app's state: what it served, and the failures still owed per key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: list[Served] = []
        self.failures: dict[str, int] = {}
        self.generation = 0
        """Bumped by reset: a request that began before it (a previous test's, still
        waiting) is not recorded."""

    def record(self, served: Served, generation: int) -> Served:
        with self.lock:
            if generation == self.generation:
                self.served.append(served)
        return served

    def stats(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(vars(s)) for s in self.served]

    def reset(self) -> None:
        with self.lock:
            self.served.clear()
            self.failures.clear()
            self.generation += 1


def prompt_tokens(body: dict[str, Any]) -> int:
    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for key in ("content", "text", "input"):
                if key in value:
                    walk(value[key])
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(body.get("messages"))
    walk(body.get("input"))
    return max(1, math.ceil(sum(len(t) for t in texts) / 4))


def build_app(provider: FakeProvider) -> Starlette:
    async def handle(request: Request) -> Response:
        generation = provider.generation
        body = await request.json()
        path = request.url.path
        headers = {k: v for k, v in request.headers.items() if k.startswith(("x-", "budget",
                                                                              "traceparent"))}
        served = Served(path=path, model=str(body.get("model")), status=200,
                        stream=body.get("stream") is True,
                        retry_count=request.headers.get("x-stainless-retry-count"),
                        headers=headers)
        wait = int(request.headers.get("x-fake-wait-ms", "0")) / 1000
        if wait:  # before the headers: a slow provider, or a timeout on demand
            await asyncio.sleep(wait)
        status = int(request.headers.get("x-fake-status", "200"))
        key = request.headers.get("x-fake-key")
        if key is not None:
            with provider.lock:
                owed = provider.failures.setdefault(
                    key, int(request.headers.get("x-fake-fail-first", "0")))
                if owed > 0:
                    provider.failures[key] = owed - 1
                    status = 500
        if status >= 400:
            served.status = status
            provider.record(served, generation)
            return JSONResponse({"error": {"message": f"fake {status}", "type": "fake"}},
                                status_code=status)
        limit = next((body[f] for f in ("max_completion_tokens", "max_output_tokens",
                                        "max_tokens") if isinstance(body.get(f), int)), None)
        completion = int(request.headers.get("x-fake-completion",
                                              min(limit if limit is not None else 20, 20)))
        served.prompt_tokens = prompt_tokens(body)
        served.completion_tokens = 0 if path.endswith("/embeddings") else completion
        tool = "x-fake-tool" in request.headers or _next_tool(body) is not None
        delay = int(request.headers.get("x-fake-delay-ms", "0")) / 1000
        if served.stream:
            events = _STREAMS[path.rsplit("/", 2)[-1]](body, served, tool)
            served.stream_sha256 = hashlib.sha256(b"".join(events)).hexdigest()
            return StreamingResponse(_paced(events, served, delay, provider, generation),
                                     media_type="text/event-stream")
        provider.record(served, generation)
        return JSONResponse(_BODIES[path.rsplit("/", 2)[-1]](body, served, tool))

    routes = [Route(p, handle, methods=["POST"]) for p in (
        "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/messages")]
    return Starlette(routes=routes)


def _called(body: dict[str, Any]) -> list[str]:
    """The names of the tools the conversation already called (Chat Completions
    ``tool_calls``, Anthropic ``tool_use`` blocks, Responses ``function_call`` items)."""
    names: list[str] = []
    items = body.get("messages") or (body.get("input") if isinstance(body.get("input"),
                                                                       list) else [])
    for m in items:
        if not isinstance(m, dict):
            continue
        names += [c["function"]["name"] for c in m.get("tool_calls") or []]
        content = m.get("content")
        if isinstance(content, list):
            names += [c["name"] for c in content
                      if isinstance(c, dict) and c.get("type") == "tool_use"]
        if m.get("type") == "function_call":
            names.append(m["name"])
    return names


def _next_tool(body: dict[str, Any]) -> str | None:
    """The first tool offered that the conversation has not called yet (None: answer in
    text): an agent calls each of its tools once, then answers."""
    called = _called(body)
    for tool in body.get("tools") or []:
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        if name and name not in called:
            return str(name)
    return None


def _tool_name(body: dict[str, Any]) -> str:
    return _next_tool(body) or "lookup"


# -- non-streaming bodies --------------------------------------------------------------

def _chat(body: dict[str, Any], s: Served, tool: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": CHUNK_TEXT * s.completion_tokens}
    finish = "stop"
    if tool:
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{len(_called(body)) + 1}", "type": "function",
            "function": {"name": _tool_name(body), "arguments": "{\"city\": \"Paris\"}"}}]}
        finish = "tool_calls"
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
            "model": s.model, "choices": [{"index": 0, "message": message,
                                           "finish_reason": finish}],
            "usage": {"prompt_tokens": s.prompt_tokens,
                      "completion_tokens": s.completion_tokens,
                      "total_tokens": s.prompt_tokens + s.completion_tokens}}


def _responses(body: dict[str, Any], s: Served, tool: bool) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": int(time.time()),
            "model": s.model, "status": "completed", "output": [{
                "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": CHUNK_TEXT * s.completion_tokens,
                             "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": s.prompt_tokens, "output_tokens": s.completion_tokens,
                      "total_tokens": s.prompt_tokens + s.completion_tokens,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def _embeddings(body: dict[str, Any], s: Served, tool: bool) -> dict[str, Any]:
    return {"object": "list", "model": s.model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
            "usage": {"prompt_tokens": s.prompt_tokens, "total_tokens": s.prompt_tokens}}


def _messages(body: dict[str, Any], s: Served, tool: bool) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": CHUNK_TEXT * s.completion_tokens}]
    stop = "end_turn"
    if tool:
        content = [{"type": "tool_use", "id": f"toolu_{len(_called(body)) + 1}",
                    "name": _tool_name(body),
                    "input": {"city": "Paris"}}]
        stop = "tool_use"
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": s.model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": s.prompt_tokens, "output_tokens": s.completion_tokens}}


_BODIES = {"completions": _chat, "responses": _responses, "embeddings": _embeddings,
           "messages": _messages}


# -- streams ---------------------------------------------------------------------------

def _chat_stream(body: dict[str, Any], s: Served, tool: bool) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                "model": s.model, "choices": [{"index": 0, "delta": delta,
                                               "finish_reason": finish}], **extra}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": CHUNK_TEXT}) for _ in range(s.completion_tokens)]
    events.append(chunk({}, "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                 "total_tokens": s.prompt_tokens + s.completion_tokens}
        data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                "model": s.model, "choices": [], "usage": usage}
        events.append(b"data: " + json.dumps(data).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _messages_stream(body: dict[str, Any], s: Served, tool: bool) -> list[bytes]:
    start = {"message": {"id": "msg_1", "type": "message", "role": "assistant",
                         "model": s.model, "content": [], "stop_reason": None,
                         "stop_sequence": None,
                         "usage": {"input_tokens": s.prompt_tokens, "output_tokens": 0}}}
    events = [_sse("message_start", start),
              _sse("content_block_start", {"index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
    events += [_sse("content_block_delta", {"index": 0, "delta": {
        "type": "text_delta", "text": CHUNK_TEXT}}) for _ in range(s.completion_tokens)]
    events += [_sse("content_block_stop", {"index": 0}),
               _sse("message_delta", {"delta": {"stop_reason": "end_turn",
                                                "stop_sequence": None},
                                      "usage": {"output_tokens": s.completion_tokens}}),
               _sse("message_stop", {})]
    return events


def _responses_stream(body: dict[str, Any], s: Served, tool: bool) -> list[bytes]:
    done = _responses(body, s, tool)
    events = [_sse("response.created", {"sequence_number": 0,
                                        "response": {**done, "status": "in_progress",
                                                     "usage": None, "output": []}})]
    events += [_sse("response.output_text.delta", {
        "sequence_number": i + 1, "item_id": "msg_1", "output_index": 0,
        "content_index": 0, "delta": CHUNK_TEXT, "logprobs": []})
        for i in range(s.completion_tokens)]
    events.append(_sse("response.completed", {"sequence_number": s.completion_tokens + 1,
                                              "response": done}))
    return events


_STREAMS = {"completions": _chat_stream, "messages": _messages_stream,
            "responses": _responses_stream}


async def _paced(events: list[bytes], served: Served, delay: float,
                 provider: FakeProvider, generation: int) -> AsyncIterator[bytes]:
    provider.record(served, generation)
    try:
        for event in events:
            yield event
            served.chunks_sent += 1
            if delay:
                await asyncio.sleep(delay)
    except (asyncio.CancelledError, GeneratorExit):
        served.disconnected = True
        raise


class ProviderServer:
    """The fake provider under uvicorn in a thread of this process."""

    def __init__(self) -> None:
        self.provider = FakeProvider()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            build_app(self.provider), host="127.0.0.1", port=self.port,
            log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive()
            time.sleep(0.02)

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def stop(self) -> None:
        """Stop serving. Clients the test left open (a framework's own, an SDK client in a
        reference cycle) are collected here, quietly, rather than in whichever later test
        runs when the garbage collector next passes."""
        self.server.should_exit = True
        self.thread.join(10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


class ProviderServerH2(ProviderServer):
    """The fake provider under hypercorn, which also speaks HTTP/2 over cleartext (a
    client with ``http1=False, http2=True`` multiplexes its requests on one connection)."""

    def __init__(self) -> None:  # noqa: D107 - the parent's, served by hypercorn
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        self.provider = FakeProvider()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.loglevel = "WARNING"
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, daemon=True,
                                       args=(serve(build_app(self.provider), config,
                                                   shutdown_trigger=self.stopping.wait),))
        self.thread.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and self.thread.is_alive()
                time.sleep(0.02)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)
        self.loop.close()


def main() -> None:
    """Serve the fake provider in the foreground on the port given (the benchmark runs
    it in a process of its own): ``python -m tests.support.fake_provider PORT``."""
    import sys

    uvicorn.run(build_app(FakeProvider()), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
