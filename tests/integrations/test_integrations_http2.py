"""An abort over HTTP/2, where one connection carries the requests of many trees: it stops
only the aborted context's request, never the others multiplexed beside it (the provider
under hypercorn, the official OpenAI SDK on an ``httpx2`` HTTP/2 client)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.integrations import BudgetExceededError, budgeted

pytest.importorskip("hypercorn")
pytest.importorskip("h2")
httpx2 = pytest.importorskip("httpx2")

from tests.support.fake_provider import ProviderServerH2  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
SLOW = {"x-fake-delay-ms": "40", "x-fake-completion": "30"}
"""30 text chunks 40 ms apart, between a role chunk and the finish and usage chunks: 33."""


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderServerH2]:
    server = ProviderServerH2()
    yield server
    server.stop()


def _root() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=100,
                                            max_retries_total=5))


def test_an_abort_cuts_only_its_own_stream_on_a_shared_connection(
        coord: Coordinator, provider: ProviderServerH2) -> None:
    http = httpx2.Client(http1=False, http2=True)
    client = budgeted(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="k",
                                    max_retries=0, http_client=http))
    contexts: dict[str, ExecutionContext] = {}
    outcomes: dict[str, Any] = {}
    streaming = threading.Barrier(3)

    def run(name: str) -> None:
        with _root() as ctx:
            contexts[name] = ctx
            chunks, versions = 0, set()
            try:
                stream = client.chat.completions.with_raw_response.create(
                    model="gpt-4o", messages=MESSAGES, max_tokens=40, stream=True,
                    extra_headers=SLOW)
                versions.add(stream.http_response.http_version)
                for _ in stream.parse():
                    chunks += 1
                    if chunks == 2 and name != "alone":
                        streaming.wait(10)
                outcomes[name] = ("done", chunks, versions)
            except BudgetExceededError as exc:
                outcomes[name] = (exc.reason, chunks, versions)
            except Exception as exc:  # noqa: BLE001 - the test reports what it got
                outcomes[name] = (type(exc).__name__, chunks, versions)

    run("alone")  # what a whole stream is, and the connection the two below share
    assert outcomes["alone"][0] == "done"
    threads = [threading.Thread(target=run, args=(n,)) for n in ("aborted", "other")]
    for t in threads:
        t.start()
    streaming.wait(10)  # both streams are under way on the one connection
    contexts["aborted"].abort("operator pressed stop")
    for t in threads:
        t.join(20)
    http.close()
    assert outcomes["aborted"][0] == "aborted"
    assert outcomes["other"][:2] == outcomes["alone"][:2]  # every chunk
    assert outcomes["other"][2] == outcomes["aborted"][2] == {"HTTP/2"}
    snap = contexts["other"].get_snapshot()
    assert snap.nodes[0].status == "ok" and snap.nodes[0].output_tokens == 30


def test_an_async_abort_cuts_only_its_own_stream_on_a_shared_connection(
        coord: Coordinator, provider: ProviderServerH2) -> None:
    async def run_both() -> dict[str, tuple[str, int]]:
        http = httpx2.AsyncClient(http1=False, http2=True)
        client = budgeted(openai.AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="k",
                                             max_retries=0, http_client=http))
        started = asyncio.Event()
        out: dict[str, tuple[str, int]] = {}

        async def run(name: str, ctx: ExecutionContext) -> None:
            chunks = 0
            try:
                async with ctx:
                    stream = await client.chat.completions.create(
                        model="gpt-4o", messages=MESSAGES, max_tokens=40, stream=True,
                        extra_headers=SLOW)
                    async for _ in stream:
                        chunks += 1
                        if chunks == 2:
                            started.set()
                out[name] = ("done", chunks)
            except BudgetExceededError as exc:
                out[name] = (exc.reason, chunks)

        aborted, other = _root(), _root()
        tasks = [asyncio.create_task(run("aborted", aborted)),
                 asyncio.create_task(run("other", other))]
        await started.wait()
        await asyncio.sleep(0.1)
        threading.Thread(target=aborted.abort, args=("operator pressed stop",)).start()
        await asyncio.gather(*tasks)
        await http.aclose()
        return out

    started = time.monotonic()
    out = asyncio.run(run_both())
    # role, 30 texts, stop (the usage chunk the transport asked for is not shown)
    assert out["aborted"][0] == "aborted" and out["other"] == ("done", 32)
    assert time.monotonic() - started < 10
