"""Real services: FastAPI apps under uvicorn in their own processes, on loopback ports,
joined to the caller's tree through the ``budget-context`` header."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator import (
    ContextSnapshot,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    current_context,
    report_usage,
)
from coordinator.core.token_codec import MAX_TOKEN_BYTES, TokenCodec
from coordinator.embedded import RedisServer, free_port
from tests.context.test_tokens import forge, good_fields, redis_state
from tests.support.procs import TEST_KEYS

REPO = Path(__file__).resolve().parents[2]
KEYS_SPEC = ",".join(f"{k}:{v.decode()}" for k, v in TEST_KEYS.items())
SERVICE_CONFIG = ExecutionConfig(max_cost_usd=0.5, max_steps=100, max_retries_total=10)
CALLER = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=10)
LOOPBACK = ["127.0.0.1"]


def build_app() -> Any:
    """The service under test (run by uvicorn in a subprocess, configured from env)."""
    from fastapi import FastAPI

    from coordinator.http import BudgetContextMiddleware
    from coordinator.http.httpx_client import async_budget_event_hooks

    app = FastAPI()
    app.add_middleware(BudgetContextMiddleware, config=SERVICE_CONFIG)

    def here() -> dict[str, Any]:
        ctx = current_context()
        assert ctx is not None
        return {"chain_id": ctx.chain_id, "root_id": ctx.root_id, "path": list(ctx.path)}

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/spend")
    def spend_sync(usd: float) -> dict[str, Any]:  # runs in a worker thread
        ctx = current_context()
        assert ctx is not None
        return {"decision": spend(ctx, usd).value, **here()}

    @app.post("/relay")
    async def relay(usd: float, next_usd: float) -> dict[str, Any]:
        """Spend in a child of the caller's context, then call the next service in it."""
        parent = current_context()
        assert parent is not None
        with parent.spawn_child() as child:
            async def call() -> None:
                report_usage(cost_usd=usd)

            decision = await child.awrap_llm_call(call, WrapOptions(cost_estimate_hint=usd))
            hooks = async_budget_event_hooks(hosts=LOOPBACK)
            async with httpx.AsyncClient(event_hooks=hooks) as client:
                nxt = await client.post(f"{os.environ['NEXT_URL']}/spend",
                                        params={"usd": next_usd})
            return {"decision": decision.value, "next": nxt.json(), **here()}

    return app


def spend(ctx: ExecutionContext, usd: float) -> Decision:
    def call() -> None:
        report_usage(cost_usd=usd)

    return ctx.wrap_llm_call(call, WrapOptions(cost_estimate_hint=usd))


class Service:
    """``build_app`` under uvicorn in a child process."""

    def __init__(self, redis_url: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="svc-", suffix=".log", delete=False)
        code = ("import uvicorn; uvicorn.run('tests.http.test_http_fastapi:build_app', "
                f"factory=True, host='127.0.0.1', port={self.port}, log_level='warning')")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, stdout=self.log, stderr=self.log,
            env={**os.environ, "BUDGET_REDIS_URL": redis_url, "BUDGET_TOKEN_KEYS": KEYS_SPEC,
                 "BUDGET_TENANT": "", **env},
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"service did not start: {Path(self.log.name).read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="module")
def services(redis_server: RedisServer) -> Iterator[dict[str, Service]]:
    """Service B, and service A whose /relay calls B. Both start in parallel."""
    b = Service(redis_server.url)
    a = Service(redis_server.url, NEXT_URL=b.url)
    try:
        b.wait_ready()
        a.wait_ready()
        yield {"A": a, "B": b}
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    from coordinator.http.httpx_client import budget_event_hooks

    with httpx.Client(event_hooks=budget_event_hooks(hosts=LOOPBACK), timeout=30) as client:
        yield client


def test_a_call_from_inside_a_context_spends_in_the_callers_tree(
    coord: Coordinator, services: dict[str, Service], http: httpx.Client
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        r = http.post(f"{services['B'].url}/spend", params={"usd": 0.2})
        assert r.status_code == 200, r.text
        assert r.json() == {"decision": "ALLOW", "chain_id": root.chain_id,
                            "root_id": root.root_id, "path": [root.chain_id]}
        snap = settled(root.chain_id, coord, 0.2)
        assert snap.step_count == 1 and snap.cost_usd_reserved == 0


def test_a_chain_of_two_services_rolls_spend_up_to_the_callers_root(
    coord: Coordinator, services: dict[str, Service], http: httpx.Client
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        r = http.post(f"{services['A'].url}/relay", params={"usd": 0.1, "next_usd": 0.25})
        assert r.status_code == 200, r.text
        body = r.json()
        child = body["chain_id"]
        assert body["path"] == [root.chain_id, child]
        assert body["next"]["decision"] == "ALLOW"
        assert body["next"]["path"] == [root.chain_id, child]  # B joined A's child
        assert settled(root.chain_id, coord, 0.35).step_count == 2
        assert settled(child, coord, 0.35).parent_chain_id == root.chain_id


def test_the_callers_limits_hold_in_every_service(
    coord: Coordinator, services: dict[str, Service], http: httpx.Client
) -> None:
    tight = ExecutionConfig(max_cost_usd=0.3, max_steps=100, max_retries_total=10)
    with ExecutionContext(tight, coordinator=coord) as root:
        first = http.post(f"{services['B'].url}/spend", params={"usd": 0.2}).json()
        second = http.post(f"{services['A'].url}/relay", params={"usd": 0.05, "next_usd": 0.2})
        assert first["decision"] == "ALLOW"
        assert second.json()["decision"] == "ALLOW"
        assert second.json()["next"]["decision"] == "HALT"  # 0.45 > 0.3, whatever B allows
        settled(root.chain_id, coord, 0.25)


def test_without_a_header_a_service_runs_in_its_own_closed_root(
    coord: Coordinator, services: dict[str, Service]
) -> None:
    r = httpx.post(f"{services['B'].url}/spend", params={"usd": 0.2})
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "ALLOW" and body["path"] == [body["root_id"]]
    snap = settled(body["root_id"], coord, 0.2)
    assert snap.max_cost_usd == pytest.approx(SERVICE_CONFIG.max_cost_usd)
    wait_closed(coord, body["root_id"])


def settled(chain_id: str, coord: Coordinator, usd: float) -> ContextSnapshot:
    """The snapshot once ``usd`` is settled. The middleware flushes before the response
    ends, but a settle that the background flusher had already taken may land a moment
    later (see docs/http.md); no test may depend on that moment."""
    deadline = time.monotonic() + 10
    while True:
        snap = ExecutionContext.load_snapshot(chain_id, coord)
        if snap.cost_usd_accumulated == pytest.approx(usd) or time.monotonic() > deadline:
            assert snap.cost_usd_accumulated == pytest.approx(usd)
            return snap
        time.sleep(0.02)


def wait_closed(coord: Coordinator, chain_id: str) -> None:
    """The middleware closes a request's own root after the response has gone out."""
    deadline = time.monotonic() + 10
    while ExecutionContext.load_snapshot(chain_id, coord).status != "closed":
        assert time.monotonic() < deadline, "the request's root was never closed"
        time.sleep(0.05)


def _bad_tokens(root: ExecutionContext) -> dict[str, tuple[Callable[[], Any], int, str]]:
    now = int(time.time())
    ids = {"root": root.root_id, "ctx": root.chain_id, "path": [root.root_id]}
    real = TokenCodec(TEST_KEYS)
    other_key = b"another-secret-0123456789"
    return {
        "tampered": (lambda: forge(good_fields(**{**ids, "ctx": "x", "path": [root.root_id, "x"]},
                                               issued=now, expires=now + 60), other_key)
                     .split(".")[0] + "." + root.token.split(".")[1],
                     401, "token_signature"),
        "truncated": (lambda: root.token[:-6], 400, "token_malformed"),
        "expired": (lambda: real.encode(root=root.root_id, path=root.path, tenant="",
                                        ttl_s=60, now=now - 3600), 401, "token_expired"),
        "oversized": (lambda: root.token + "A" * MAX_TOKEN_BYTES, 400, "token_too_large"),
        "unknown key": (lambda: TokenCodec({"k9": other_key}).encode(
            root=root.root_id, path=root.path, tenant="", ttl_s=60, now=now),
            401, "unknown_key"),
        "wrong version": (lambda: forge(good_fields(**ids, v=2, issued=now, expires=now + 60)),
                          400, "token_version"),
        "re-signed with a wrong key": (lambda: TokenCodec({"test": other_key}).encode(
            root=root.root_id, path=root.path, tenant="", ttl_s=60, now=now),
            401, "token_signature"),
        "another tenant": (lambda: real.encode(root=root.root_id, path=root.path,
                                               tenant="B", ttl_s=60, now=now),
                           403, "tenant_mismatch"),
        "unknown context": (lambda: real.encode(root="gone", path=("gone",), tenant="",
                                                ttl_s=60, now=now), 404, "context_not_found"),
        "garbage": (lambda: "%%%not a token%%%", 400, "token_malformed"),
    }


@pytest.mark.parametrize("kind", ["tampered", "truncated", "expired", "oversized",
                                  "unknown key", "wrong version", "re-signed with a wrong key",
                                  "another tenant", "unknown context", "garbage"])
def test_a_bad_token_gets_its_status_and_changes_nothing(
    coord: Coordinator, services: dict[str, Service], kind: str
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        make, status, code = _bad_tokens(root)[kind]
        token = make()
        coord.store.flush()
        before = redis_state(coord.client)
        for svc, path in ((services["B"], "/spend"), (services["A"], "/relay")):
            r = httpx.post(f"{svc.url}{path}", params={"usd": 0.1, "next_usd": 0.1},
                           headers={"budget-context": token})
            assert r.status_code == status, r.text
            assert r.headers["content-type"] == "application/json"
            assert r.json()["error"] == code and r.json()["status"] == status
        assert redis_state(coord.client) == before


def test_two_context_headers_are_refused(
    coord: Coordinator, services: dict[str, Service]
) -> None:
    with ExecutionContext(CALLER, coordinator=coord) as root:
        coord.store.flush()
        before = redis_state(coord.client)
        r = httpx.post(f"{services['B'].url}/spend", params={"usd": 0.1},
                       headers=[("budget-context", root.token), ("budget-context", root.token)])
        assert (r.status_code, r.json()["error"]) == (400, "token_malformed")
        assert redis_state(coord.client) == before
