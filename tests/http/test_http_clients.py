"""Client hooks (httpx sync and async, requests) send the current context to the named
hosts only, never to another host, not even through a redirect; a plain Starlette app
under uvicorn (in a thread, on a loopback port) receives it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse
from starlette.routing import Route

from coordinator import Coordinator, ExecutionContext, current_context
from coordinator.embedded import free_port
from coordinator.http import BudgetContextMiddleware
from coordinator.http.common import HostPolicy
from coordinator.http.httpx_client import async_budget_event_hooks, budget_event_hooks
from coordinator.http.requests_client import mount_budget_context
from tests.http.test_http_fastapi import CALLER


async def echo(request: Request) -> JSONResponse:
    ctx = current_context()
    return JSONResponse({"header": request.headers.get("budget-context"),
                         "chain_id": ctx.chain_id if ctx is not None else None})


async def redirect(request: Request) -> RedirectResponse:
    return RedirectResponse(request.query_params["to"], status_code=307)


def make_app(require_context: bool) -> Starlette:
    return Starlette(
        routes=[Route("/echo", echo, methods=["GET", "POST"]),
                Route("/redirect", redirect, methods=["GET", "POST"])],
        middleware=[Middleware(BudgetContextMiddleware, require_context=require_context)],
    )


class ThreadServer:
    """uvicorn serving ``app`` from a thread of this process."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive()
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ThreadServer]]:
    """``open`` runs requests without a header context-free; ``strict`` requires one."""
    running = {"open": ThreadServer(make_app(False)), "strict": ThreadServer(make_app(True))}
    yield running
    for s in running.values():
        s.stop()


@pytest.fixture
def urls(servers: dict[str, ThreadServer], coord: Coordinator) -> dict[str, str]:
    """The servers use the default coordinator, which ``coord`` installs per test."""
    return {name: s.url for name, s in servers.items()}


def test_httpx_sends_the_current_context_to_named_hosts_only(
    coord: Coordinator, urls: dict[str, str]
) -> None:
    open_port = urls["open"].rsplit(":", 1)[1]
    hooks = budget_event_hooks(hosts=[f"127.0.0.1:{open_port}"])
    with httpx.Client(event_hooks=hooks) as http, \
            ExecutionContext(CALLER, coordinator=coord) as root:
        named = http.get(f"{urls['open']}/echo").json()
        assert named["chain_id"] == root.chain_id and named["header"]
        other = http.get(f"{urls['strict']}/echo")  # another port: not named
        assert (other.status_code, other.json()["error"]) == (401, "token_missing")
        # A redirect from a named host to another one drops the header.
        hop = http.get(f"{urls['open']}/redirect",
                       params={"to": f"{urls['strict']}/echo"}, follow_redirects=True)
        assert (hop.status_code, hop.json()["error"]) == (401, "token_missing")
        # A stale header set by hand is stripped for a host that is not named.
        stale = http.get(f"{urls['strict']}/echo", headers={"budget-context": root.token})
        assert stale.status_code == 401


def test_httpx_outside_a_context_sends_no_header(urls: dict[str, str]) -> None:
    with httpx.Client(event_hooks=budget_event_hooks(hosts=["*"])) as http:
        assert http.get(f"{urls['open']}/echo").json() == {"header": None, "chain_id": None}
        assert http.get(f"{urls['strict']}/echo").status_code == 401


def test_async_httpx_sends_the_context_of_the_running_task(
    coord: Coordinator, urls: dict[str, str]
) -> None:
    async def scenario() -> tuple[str | None, str | None, str, str]:
        hooks = async_budget_event_hooks(hosts=["127.0.0.1"])
        async with httpx.AsyncClient(event_hooks=hooks) as http:
            async with ExecutionContext(CALLER, coordinator=coord) as root:
                child = root.spawn_child()
                with child:  # the current context is the child inside this block
                    in_child = (await http.post(f"{urls['strict']}/echo")).json()
                in_root = (await http.post(f"{urls['strict']}/echo")).json()
                return in_child["chain_id"], in_root["chain_id"], child.chain_id, root.chain_id

    seen_child, seen_root, child_id, root_id = asyncio.run(scenario())
    assert (seen_child, seen_root) == (child_id, root_id)


def test_requests_sends_the_context_to_named_hosts_only(
    coord: Coordinator, urls: dict[str, str]
) -> None:
    open_port = urls["open"].rsplit(":", 1)[1]
    with mount_budget_context(requests.Session(), hosts=[f"127.0.0.1:{open_port}"]) as http, \
            ExecutionContext(CALLER, coordinator=coord) as root:
        assert http.get(f"{urls['open']}/echo").json()["chain_id"] == root.chain_id
        assert http.get(f"{urls['strict']}/echo").status_code == 401
        hop = http.get(f"{urls['open']}/redirect", params={"to": f"{urls['strict']}/echo"})
        assert (hop.status_code, hop.json()["error"]) == (401, "token_missing")
        assert [r.status_code for r in hop.history] == [307]


def test_hosts_must_be_named() -> None:
    with pytest.raises(ValueError):
        budget_event_hooks(hosts=[])


def test_host_entries_match_names_and_effective_ports() -> None:
    policy = HostPolicy(["svc.internal:443", "Other.Internal"])
    assert policy.allows("https", "SVC.internal", None)  # 443 is https's default
    assert not policy.allows("http", "svc.internal", None)
    assert not policy.allows("https", "svc.internal", 8443)
    assert policy.allows("http", "other.internal", 8080)
    assert not policy.allows("https", "svc.internal.evil.example", None)
