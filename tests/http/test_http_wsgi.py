"""The WSGI middleware under a real WSGI server (wsgiref, in a thread on a loopback port),
called with ``requests`` through the client adapter."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests

from coordinator import Coordinator, ExecutionContext, current_context
from coordinator.embedded import free_port
from coordinator.http import BudgetContextWSGIMiddleware
from coordinator.http.requests_client import mount_budget_context
from tests.context.test_tokens import redis_state
from tests.http.test_http_fastapi import (
    CALLER,
    SERVICE_CONFIG,
    _bad_tokens,
    settled,
    spend,
    wait_closed,
)
from tests.support.procs import TEST_KEYS


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """/spend?usd= spends in the call; /stream spends while its body is iterated."""
    usd = float(parse_qs(environ["QUERY_STRING"]).get("usd", ["0"])[0])
    start_response("200 OK", [("Content-Type", "application/json")])
    if environ["PATH_INFO"] == "/stream":
        return stream(usd)
    ctx = current_context()
    assert ctx is not None
    return [json.dumps({"decision": spend(ctx, usd).value, "chain_id": ctx.chain_id,
                        "root_id": ctx.root_id}).encode()]


def stream(usd: float) -> Iterator[bytes]:
    yield b'{"chunks": ['
    for i in range(3):
        ctx = current_context()  # current while the server iterates the body
        assert ctx is not None
        yield json.dumps(spend(ctx, usd).value).encode() + (b"," if i < 2 else b"")
    yield b"]}"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr."""


@contextmanager
def serve(coordinator: Coordinator) -> Iterator[str]:
    """The app behind the middleware, under wsgiref in a thread; yields its URL."""
    wrapped = BudgetContextWSGIMiddleware(app, coordinator=coordinator, config=SERVICE_CONFIG)
    httpd: WSGIServer = make_server("127.0.0.1", 0, wrapped, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def server(coord: Coordinator) -> Iterator[str]:
    with serve(coord) as url:
        yield url


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with mount_budget_context(requests.Session(), hosts=["127.0.0.1"]) as s:
        yield s


def test_requests_from_inside_a_context_spend_in_the_callers_tree(
    coord: Coordinator, server: str, session: requests.Session
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        body = session.post(f"{server}/spend", params={"usd": 0.15}).json()
        assert body == {"decision": "ALLOW", "chain_id": root.chain_id,
                        "root_id": root.root_id}
        settled(root.chain_id, coord, 0.15)


def test_a_streamed_body_spends_in_the_context_and_is_flushed_before_it_ends(
    coord: Coordinator, server: str, session: requests.Session
) -> None:
    tight = CALLER.model_copy(update={"max_cost_usd": 0.25})
    with ExecutionContext(tight, coordinator=coord) as root:
        r = session.get(f"{server}/stream", params={"usd": 0.1})
        assert r.json() == {"chunks": ["ALLOW", "ALLOW", "HALT"]}
        settled(root.chain_id, coord, 0.2)


def test_without_a_header_the_request_gets_its_own_root_closed_at_the_end(
    coord: Coordinator, server: str
) -> None:
    body = requests.post(f"{server}/spend", params={"usd": 0.2}).json()
    assert body["decision"] == "ALLOW" and body["chain_id"] == body["root_id"]
    snap = settled(body["root_id"], coord, 0.2)
    assert snap.max_cost_usd == pytest.approx(SERVICE_CONFIG.max_cost_usd)
    wait_closed(coord, body["root_id"])


@pytest.mark.parametrize("kind", ["tampered", "truncated", "expired", "oversized",
                                  "unknown key", "wrong version", "re-signed with a wrong key",
                                  "another tenant", "unknown context", "garbage"])
def test_a_bad_token_gets_its_status_and_changes_nothing(
    coord: Coordinator, server: str, kind: str
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        make, status, code = _bad_tokens(root)[kind]
        coord.store.flush()
        before = redis_state(coord.client)
        r = requests.post(f"{server}/spend", params={"usd": 0.1},
                          headers={"budget-context": make()})
        assert (r.status_code, r.json()["error"], r.json()["status"]) == (status, code, status)
        assert r.headers["Content-Type"] == "application/json"
        assert redis_state(coord.client) == before


def test_redis_unreachable_while_attaching_is_a_503(coord: Coordinator) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        token = root.token
    dead = Coordinator.from_url(f"redis://127.0.0.1:{free_port()}/0", token_keys=TEST_KEYS)
    with serve(dead) as url:
        r = requests.post(f"{url}/spend", params={"usd": 0.1},
                          headers={"budget-context": token})
    assert (r.status_code, r.json()["error"]) == (503, "backend_unavailable")
    dead.client.close()
