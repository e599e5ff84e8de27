"""Helpers of the dashboard tests: the dashboard under uvicorn in a subprocess, trees
made by the test, a webhook receiver, and the bodies of the OS processes that spend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.embedded import free_port
from tests.support.procs import TEST_KEYS

OPERATOR_TOKEN = "op-token-0123456789abcdef"
VIEWER_TOKEN = "viewer-token-0123456789abcdef"
ACME_TOKEN = "acme-viewer-token-0123456789"
USERS = "olga:operator:olga-pw,victor:viewer:victor-pw,ann:operator@acme:ann-pw"
TOKENS = f"operator:{OPERATOR_TOKEN},viewer:{VIEWER_TOKEN},viewer@acme:{ACME_TOKEN}"


class Http:
    """Minimal HTTP client of the tests (status, headers, body)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(self, method: str, path: str, *, token: str | None = None,
                body: Any = None, headers: dict[str, str] | None = None
                ) -> tuple[int, dict[str, str], str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=dict(headers or {}))
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, dict(exc.headers), exc.read().decode()

    def json(self, path: str, token: str | None = OPERATOR_TOKEN) -> Any:
        status, _, body = self.request("GET", path, token=token)
        assert status == 200, (status, body)
        return json.loads(body)


@contextmanager
def dashboard(redis_url: str, *, host: str = "127.0.0.1", auth: bool = True,
              env: dict[str, str] | None = None) -> Iterator[Http]:
    """``python -m coordinator.dashboard`` on a free port, until the block ends."""
    port = free_port()
    full = dict(os.environ, BUDGET_TOKEN_KEYS="test:" + TEST_KEYS["test"].decode(),
                BUDGET_DASHBOARD_SWEEP_S="1", **(env or {}))
    for name in ("BUDGET_DASHBOARD_USERS", "BUDGET_DASHBOARD_TOKENS"):
        full.pop(name, None)
    if auth:
        full.update(BUDGET_DASHBOARD_USERS=USERS, BUDGET_DASHBOARD_TOKENS=TOKENS)
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.dashboard", "--redis",
                             redis_url, "--host", host, "--port", str(port)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    http = Http(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 120  # a process start on a loaded CI machine
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dashboard exited: {proc.stdout.read().decode()}")  # type: ignore[union-attr]
            try:
                if http.request("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("dashboard did not start")
            time.sleep(0.1)
        yield http
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def coordinator(url: str, tenant: str = "") -> Coordinator:
    return Coordinator.from_url(url, token_keys=TEST_KEYS, tenant=tenant)


def open_tree(coord: Coordinator, chain_id: str, *, ceiling: float = 1.0, team: str = "research",
              org: str = "acme", service: str = "agent") -> ExecutionContext:
    """A root context opened in Redis at once. It is made on a thread of its own: the
    browser tests drive Playwright's sync API, which runs an event loop on the test's
    thread, and a root made on a running loop opens in the background, not at once."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(
            ExecutionContext,
            ExecutionConfig(max_cost_usd=ceiling, max_steps=10_000, max_retries_total=10),
            metadata=ChainMetadata(request_id=f"req-{chain_id}", chain_id=chain_id,
                                   org_id=org, team=team, service=service),
            coordinator=coord).result()


def spend(ctx: ExecutionContext, usd: float, *, tokens: int = 0, provider: str | None = None,
          operation: str = "answer") -> Decision:
    def body() -> None:
        if tokens:
            report_usage(cost_usd=usd, input_tokens=tokens, output_tokens=tokens // 2,
                         provider=provider or "openai")
        else:
            report_usage(cost_usd=usd)
    return ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=usd, operation_name=operation))


# -- bodies of the OS processes the tests start (multiprocessing, spawn) --------------------

def spend_steps(url: str, token: str, steps: list[float], pause_s: float) -> None:
    """Spend each amount of ``steps`` in turn through an attached context."""
    coord = coordinator(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    for usd in steps:
        spend(ctx, usd)
        coord.store.flush()
        time.sleep(pause_s)
    ctx.close()
    coord.close()


def spend_until_stopped(url: str, token: str, ready: Any, out: Any) -> None:
    """Make small calls until the tree halts them; report how it ended."""
    coord = coordinator(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ready.set()
    calls = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if spend(ctx, 0.0001) == Decision.HALT:
            out.put({"calls": calls, "stop": ctx.stop_reason})
            break
        calls += 1
        time.sleep(0.02)
    else:
        out.put({"calls": calls, "stop": None})
    ctx.close()
    coord.close()


class WebhookReceiver:
    """An HTTP server that records every POST (path, headers, body)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
