"""What deploy/ ships, checked against a real redis-server: the Redis configuration loads
and keeps the ledger safe, and the ACL that deploy/README.md documents is enough for
every operation of the coordinator (and no more)."""

from __future__ import annotations

import importlib
import re
import time
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
    ShieldPipeline,
    WrapOptions,
)
from coordinator.embedded import RedisServer
from tests.support.procs import TEST_KEYS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=3)


def _spend(ctx: ExecutionContext, usd: float) -> Decision:
    return ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=usd))


def test_every_worker_the_deploy_files_start_names_a_module_that_imports() -> None:
    """The Celery app each compose file and manifest starts (``celery -A <module>``)."""
    apps = {(f.relative_to(DEPLOY).as_posix(), m)
            for f in DEPLOY.rglob("*.y*ml")
            for m in re.findall(r'"celery", "-A", "([\w.]+)"', f.read_text())}
    assert {f for f, _ in apps} >= {"docker-compose.yml", "sentinel/docker-compose.yml",
                                    "cluster/docker-compose.yml"}
    for _, module in apps:
        importlib.import_module(module)


def test_the_shipped_redis_conf_loads_with_the_settings_it_promises() -> None:
    with RedisServer(config_file=str(DEPLOY / "redis.conf")) as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert r.config_get("save") == {"save": ""}
        assert r.config_get("hash-max-ziplist-value") == {"hash-max-ziplist-value": "512"}
        r.close()


def test_a_full_redis_makes_wraps_halt_with_a_clear_reason_and_loses_nothing() -> None:
    """What deploy/redis.conf says of noeviction: writes are refused, not evicted, and
    wraps fail closed."""
    with RedisServer(config_file=str(DEPLOY / "redis.conf")) as server:
        c = Coordinator.from_url(server.url, token_keys=TEST_KEYS)
        admin = redis.Redis.from_url(server.url)
        ctx = ExecutionContext(CONFIG, coordinator=c)
        assert _spend(ctx, 0.1) == Decision.ALLOW
        c.store.flush()
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used // 2)
        ran = []
        assert ctx.wrap_llm_call(lambda: ran.append(1)) == Decision.HALT
        assert ran == []
        full = ctx.get_snapshot()
        assert full.cost_usd_accumulated == pytest.approx(0.1)
        last = full.events[-1]
        assert last.event_type == "backend_unavailable" and "maxmemory" in last.reason
        opened_while_full = ExecutionContext(CONFIG, coordinator=c)  # exists locally only
        assert _spend(opened_while_full, 0.1) == Decision.HALT
        admin.config_set("maxmemory", 0)
        assert _spend(opened_while_full, 0.1) == Decision.ALLOW  # opened now, then ran
        opened_while_full.close()
        assert _spend(ctx, 0.1) == Decision.ALLOW  # room again: calls go on
        ctx.close()
        assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.2)
        c.close()
        c.client.close()
        admin.close()


def _documented_acl() -> list[str]:
    """The ACL rules deploy/README.md gives for the coordinator's user."""
    text = (DEPLOY / "README.md").read_text()
    line = next(x for x in text.split("\n\n") if "ACL user for the coordinator" in x)
    rules = [rule for span in re.findall(r"`([^`]+)`", line) for rule in span.split()
             if rule[0] in "~&+-"]
    assert rules, "deploy/README.md names no ACL rules"
    return rules


def documented_acl_user(server: RedisServer) -> str:
    """A user with exactly the ACL rules deploy/README.md gives on ``server``: its URL."""
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "budget-svc", "on", ">svc-password-123",
                          "resetkeys", "resetchannels", "-@all", *_documented_acl())
    admin.close()
    return server.url.replace("redis://", "redis://budget-svc:svc-password-123@")


def test_the_documented_acl_is_enough_for_every_operation_and_no_more() -> None:
    with RedisServer() as server:
        url = documented_acl_user(server)
        c = Coordinator.from_url(url)  # no keys configured: the dev key kept in Redis
        other = Coordinator.from_url(url)  # another process's
        shields = ShieldPipeline(BudgetWindowHook(scope="service", max_calls=10,
                                                  window_s=60, coordinator=c))
        breaker = CircuitBreaker("provider", failure_threshold=3, coordinator=c)
        meta = ChainMetadata(request_id="r1", chain_id="acl-root", team="ml",
                             service="agent")
        with ExecutionContext(CONFIG, shields, meta, coordinator=c,
                              circuit_breaker=breaker) as root:
            assert _spend(root, 0.2) == Decision.ALLOW
            child = root.spawn_child(max_cost_usd=0.5)
            assert _spend(child, 0.1) == Decision.ALLOW
            joined = ExecutionContext.attach(child.token, other)
            assert _spend(joined, 0.1) == Decision.ALLOW
            joined.close()
            other.store.flush()
            ExecutionContext.attach(root.token, other).abort("operator stop")
            deadline = time.monotonic() + 5  # heard through pub/sub, not read back
            while child.stop_reason is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert child.stop_reason == "aborted"
            snap = root.get_snapshot()
            assert snap.cost_usd_accumulated == pytest.approx(0.4)
            assert snap.status != "running"
            child.close()
        assert c.views.active_roots() == []
        assert c.views.spend_view("team") == {"ml": 400_000}
        svc = redis.Redis.from_url(url)
        with pytest.raises(redis.exceptions.NoPermissionError):
            svc.set("not-a-budget-key", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            svc.flushall()
        svc.close()
        for co in (c, other):
            co.close()
            co.client.close()
