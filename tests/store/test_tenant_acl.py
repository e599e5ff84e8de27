"""Tenants under Redis ACL users (docs/tenants.md): a redis-server loaded with
deploy/users.acl as shipped; a tenant's user runs every path of the library (calls,
children, aborts, snapshots, lease mode, quotas, context data, the shield, sessions,
``budgetctl top``, the tenant's dashboard) with no key or channel refused, and can neither
read nor write another tenant's keys nor hear or publish on its channels."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
import redis

from coordinator import (
    BudgetWindowHook,
    ChainMetadata,
    CircuitBreaker,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    ShieldPipeline,
    WrapOptions,
    report_usage,
)
from coordinator.data.chain import read_chain
from coordinator.embedded import RedisServer
from coordinator.metrics import subscribe_ledger
from coordinator.quotas import QuotaRule, Quotas
from coordinator.sessions import ExecutionSessionIdentity, LocalKernelProvider, SessionManager
from tests.support.dashboard_server import OPERATOR_TOKEN, Http, dashboard
from tests.support.procs import TEST_KEYS

ACL_FILE = Path(__file__).resolve().parents[2] / "deploy" / "users.acl"
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
TOLERATED = {"info"}
"""Commands a tenant's user is refused and the client does without: ``INFO cluster`` when
it connects (refused: not a cluster)."""


def redis_major(admin: redis.Redis) -> int:
    return int(str(admin.info("server")["redis_version"]).split(".")[0])


def tolerated(admin: redis.Redis) -> set[str]:
    """:data:`TOLERATED`, and on Redis 6 ``CLIENT``: redis-py's ``CLIENT SETINFO`` when it
    connects, which Redis 6 refuses as a whole command (Redis 7.0 does not know it)."""
    return TOLERATED | ({"client"} if redis_major(admin) < 7 else set())


def _users() -> dict[str, tuple[str, str]]:
    """Tenant -> (user, password), read from deploy/users.acl."""
    users = {}
    for line in ACL_FILE.read_text().splitlines():
        tenant = re.search(r" ~bc:t:([^:\s]+):\* ", line)
        if tenant:
            user, password = re.match(r"user (\S+) on >(\S+) ", line).groups()  # type: ignore[union-attr]
            users[tenant.group(1)] = (user, password)
    return users


USERS = _users()
A, B = sorted(USERS)  # acme, globex


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(extra_args=("--aclfile", str(ACL_FILE))) as srv:
        yield srv


def url_of(server: RedisServer, who: str) -> str:
    """The URL of a tenant's user (``admin``: the file's administrator)."""
    if who == "admin":
        line = next(x for x in ACL_FILE.read_text().splitlines() if " ~* " in x)
        user, password = re.match(r"user (\S+) on >(\S+) ", line).groups()  # type: ignore[union-attr]
    else:
        user, password = USERS[who]
    return server.url.replace("redis://", f"redis://{user}:{password}@")


def coord_of(server: RedisServer, tenant: str) -> Coordinator:
    return Coordinator.from_url(url_of(server, tenant), token_keys=TEST_KEYS, tenant=tenant)


def spend(ctx: ExecutionContext, usd: float) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


def wait_for(what: Callable[[], object], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "not seen before the deadline"
        time.sleep(0.05)


def refused_to(admin: redis.Redis, user: str) -> set[tuple[str, str]]:
    """What the server refused ``user`` since the log was reset: (reason, object)."""
    log = admin.acl_log(count=1000)
    assert len(log) < 128, "the ACL log is full (acllog-max-len): entries were dropped"
    return {(str(e["reason"]), str(e["object"])) for e in log if e["username"] == user}


def budgetctl(server: RedisServer, *args: str) -> object:
    """``budgetctl <args> --json`` run as tenant A's user: its JSON."""
    env = dict(os.environ, BUDGET_TENANT=A, BUDGET_REDIS_URL=url_of(server, A))
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", *args, "--json"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def live_events(http: Http, root: str) -> Generator[dict[str, object], None, None]:
    """The dashboard's live feed of ``root`` (server-sent events) as JSON messages, for
    30 s at most."""
    req = urllib.request.Request(http.base + f"/api/live?roots={root}",
                                 headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    deadline = time.monotonic() + 30
    with urllib.request.urlopen(req, timeout=30) as stream:
        for line in stream:
            assert time.monotonic() < deadline, "not heard before the deadline"
            if line.startswith(b"data: "):
                yield json.loads(line[6:])


@pytest.mark.slow
def test_a_tenant_user_runs_every_path_and_is_refused_no_key_or_channel(
        server: RedisServer, short_tmp: Path) -> None:
    admin = redis.Redis.from_url(url_of(server, "admin"), decode_responses=True)
    admin.acl_log_reset()
    c, other = coord_of(server, A), coord_of(server, A)  # two processes of tenant A
    shields = ShieldPipeline(BudgetWindowHook(scope="service", max_calls=10, window_s=60,
                                              coordinator=c))
    breaker = CircuitBreaker("provider", failure_threshold=3, coordinator=c)
    meta = ChainMetadata(request_id="r1", chain_id="acl-root", team="research")
    quotas = Quotas(c)
    rule = quotas.set(QuotaRule(id="research-day", match={"team": "research"}, usd=0.5),
                      actor="ops")
    root = ExecutionContext(CONFIG, shields, meta, coordinator=c, circuit_breaker=breaker)
    assert spend(root, 0.1) == Decision.ALLOW
    assert asyncio.run(root.awrap_llm_call(lambda: asyncio.sleep(0), WrapOptions(
        cost_estimate_hint=0.01))) == Decision.ALLOW
    root.data.set("plan", {"steps": 2})
    child = root.spawn_child(max_cost_usd=0.5, step_name="search")
    assert child.data.get("plan") == {"steps": 2}
    child.data.set("found", True)
    child.merge_into_parent()
    root.checkpoint("acl-cp")
    joined = ExecutionContext.attach(child.token, other)  # another process joins
    assert spend(joined, 0.1) == Decision.ALLOW
    joined.close()
    other.store.flush()
    leased = root.spawn_child(lease=LeasePolicy(usd=0.05, steps=10, tokens=None,
                                                max_age_ms=2000))
    assert [spend(leased, 0.01) for _ in range(3)] == [Decision.ALLOW] * 3
    leased.close()
    resumed = ExecutionContext.resume("acl-cp", CONFIG, coordinator=c)
    assert resumed.data.get("found") is True
    resumed.close()
    assert read_chain(c, "acl-root")
    heard: list[object] = []
    ledger = subscribe_ledger(c, heard.append)

    def heard_once_more() -> bool:  # each reservation and rollback publishes
        root.ledger.rollback(root.ledger.reserve(input_tokens=5))
        return bool(heard)

    wait_for(heard_once_more)
    ledger.close()
    c.store.flush()
    assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.24)
    assert quotas.audit("research-day")

    top = budgetctl(server, "top")
    assert [t["id"] for t in top["trees"]] == ["acl-root"]  # type: ignore[index]
    assert budgetctl(server, "tree", "acl-root")["tree"]["id"] == "acl-root"  # type: ignore[index]
    assert "research-day" in json.dumps(budgetctl(server, "quota", "list"))
    budgetctl(server, "gc", "--dry-run")

    sessions = SessionManager(c, LocalKernelProvider(short_tmp / "kernels"))
    ran = sessions.execute_code(ExecutionSessionIdentity(
        tenant_id=A, conversation_id="c1", path_id="main"), "print(6 * 7)")
    assert ran.success and ran.output.strip() == "42"
    assert "c1" in json.dumps(budgetctl(server, "sessions", "list"))

    with dashboard(url_of(server, A), env={"BUDGET_TENANT": A}) as http:
        wait_for(lambda: "acl-root" in [t["id"] for t in http.json("/api/trees")["trees"]])
        assert http.json("/api/trees/acl-root")["root"] == "acl-root"
        assert [s["conversation"] for s in http.json("/api/sessions")["sessions"]] == ["c1"]
        assert "research-day" in json.dumps(http.json("/api/quotas")["rules"])
        assert http.json("/api/spend")["tenant"] == A
        http.json("/api/shield")
        assert http.request("GET", "/metrics", token=OPERATOR_TOKEN)[0] == 200
        events = live_events(http, "acl-root")
        assert next(e for e in events if e.get("redis") is True)  # subscribed
        status, _, body = http.request("POST", "/api/trees/acl-root/abort",
                                       token=OPERATOR_TOKEN, body={"reason": "acl test"})
        assert status == 200, body
        assert next(e for e in events if e["type"] == "stop")  # heard by the dashboard
        events.close()
        wait_for(lambda: child.stop_reason == "aborted")  # and by the process
    sessions.close()
    child.close()
    root.close()
    assert c.views.active_roots() == []
    assert budgetctl(server, "spend")["by"]["team"] == {"research": 0.24}  # type: ignore[index]
    assert sum(s.spent["usd"] for s in quotas.status(rule)) == 240_000
    for co in (c, other):
        co.close()
    assert refused_to(admin, USERS[A][0]) == {("command", cmd) for cmd in tolerated(admin)}
    admin.close()


def _refused(call: Callable[..., object], *args: object, **kwargs: object) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call(*args, **kwargs)


def _hear(client: redis.Redis, channel: str, *, pattern: bool = False) -> None:
    """Subscribe ``client`` to ``channel`` and read the server's reply."""
    listener = client.pubsub()  # type: ignore[no-untyped-call]
    try:
        (listener.psubscribe if pattern else listener.subscribe)(channel)
        listener.get_message(timeout=5)
    finally:
        listener.close()


def test_a_tenant_can_neither_read_nor_write_nor_hear_another(server: RedisServer) -> None:
    admin = redis.Redis.from_url(url_of(server, "admin"), decode_responses=True)
    admin.acl_log_reset()
    b = coord_of(server, B)
    theirs = ExecutionContext(CONFIG, metadata=ChainMetadata(request_id="r", chain_id="b-run"),
                              coordinator=b)
    assert spend(theirs, 0.3) == Decision.ALLOW
    theirs.data.set("secret", "globex only")
    b.store.flush()
    ctx_key, abort = b.keyspace.ctx("b-run", "b-run"), b.keyspace.abort_channel
    a = redis.Redis.from_url(url_of(server, A))
    b_keys = list(admin.scan_iter(match=f"bc:t:{B}:*"))
    assert ctx_key in b_keys and len(b_keys) > 5
    for key in b_keys:  # every key of B's: its tree, its data, the indexes and views
        _refused(a.dump, key)
        _refused(a.delete, key)
        _refused(a.eval, "return redis.call('TYPE', KEYS[1])", 1, key)
    _refused(a.hset, ctx_key, "l:usd", "999999999")
    _refused(a.set, f"bc:t:{B}:where:x", "b-run")
    _refused(a.get, "bc:where:b-run")  # nor the layout without a tenant
    _refused(a.publish, abort, "{}")  # no forged stop broadcast
    for channel in (abort, f"bc:t:{B}:ledger", f"bc:t:{B}:dash:alerts", "bc:abort"):
        _refused(_hear, a, channel)
    _refused(_hear, a, "bc:*", pattern=True)
    commands = [("FLUSHALL",), ("KEYS", "*"), ("SCRIPT", "FLUSH"), ("SCRIPT", "KILL"),
                ("PUBSUB", "CHANNELS"), ("CONFIG", "SET", "maxmemory", "1")]
    if redis_major(admin) >= 7:  # functions exist
        commands += [("FUNCTION", "FLUSH"), ("FUNCTION", "LOAD", "#!lua name=x\n")]
    for command in commands:
        _refused(a.execute_command, *command)
    # what docs/tenants.md says the users do not hide: key names (SCAN), not values
    assert ctx_key.encode() in set(a.scan_iter(match=f"bc:t:{B}:*"))
    assert theirs.data.get("secret") == "globex only"
    assert theirs.get_snapshot().cost_usd_accumulated == pytest.approx(0.3)
    assert theirs.get_snapshot().status == "running"
    theirs.close()
    b.close()
    assert {obj for _, obj in refused_to(admin, USERS[B][0])} == tolerated(admin)  # B ran
    for client in (a, admin):
        client.close()
