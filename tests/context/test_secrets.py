"""Secrets never printed: every URL shown (budgetctl's errors, log records, the
Coordinator's repr, the dashboard's pages, health and metrics) has its password replaced
by ``**`` (coordinator/core/redaction.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.cli import main
from coordinator.core.redaction import redact_url
from coordinator.embedded import RedisServer, free_port
from tests.support import procs
from tests.support.dashboard_server import VIEWER_TOKEN, dashboard

SECRET = "hunter2-do-not-print"


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        redis.Redis(port=server.port).config_set("requirepass", SECRET)
        yield server


def _url(server: RedisServer, password: str = SECRET) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize(("url", "password"), [
    ("redis://:{p}@127.0.0.1:6379/0", "pw"), ("redis://user:{p}@h:1/2", "p@ss"),
    ("rediss+sentinel://u:{p}@s1:26379,s2:26379/bc?sentinel_password={p}", "x"),
    ("redis+cluster://:{p}@h1:7000,h2:7001", "pw"),
    ("budgetctl: Redis unavailable at redis://:{p}@127.0.0.1:6392/0: Error 111", "pw")])
def test_redaction_masks_every_password(url: str, password: str) -> None:
    shown = redact_url(url.format(p=password))
    assert password not in shown.replace("**", "") and "**" in shown


def test_budgetctl_errors_never_print_the_password(locked_redis: RedisServer,
                                                   capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    for url in (_url(locked_redis, f"wrong-{SECRET}"),  # refused
                f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"):  # nothing listens
        code = main(["--redis", url, "top"])
        out, err = capsys.readouterr()
        assert code == 2 and err.startswith("budgetctl: ")
        assert SECRET not in out + err and ":**@" in err


def test_repr_and_log_records_never_show_the_password(locked_redis: RedisServer,
                                                      caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    caplog.set_level(logging.DEBUG)
    coord = Coordinator.from_url(_url(locked_redis), token_keys=procs.TEST_KEYS,
                                 probe_interval_ms=50)
    assert SECRET not in repr(coord) and ":**@" in repr(coord)
    ctx = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=100,
                                           max_retries_total=10), coordinator=coord)
    opts = WrapOptions(cost_estimate_hint=0.01)
    assert ctx.wrap_llm_call(lambda: None, opts) == Decision.ALLOW
    locked_redis.stop()  # a stall: the breaker, the flusher and the probe log
    try:
        assert ctx.wrap_llm_call(lambda: None, opts) == Decision.HALT
        ctx.close()
    finally:
        locked_redis.start()
        redis.Redis(port=locked_redis.port).config_set("requirepass", SECRET)
    coord.close()
    records = [r.getMessage() for r in caplog.records]
    assert any("stalled" in m for m in records)
    assert not [m for m in records if SECRET in m]


def test_dashboard_pages_health_and_metrics_never_show_the_password(
        locked_redis: RedisServer) -> None:
    with dashboard(_url(locked_redis)) as http:
        for path in ("/", "/healthz", "/metrics", "/api/trees", "/api/shield"):
            status, headers, body = http.request("GET", path, token=VIEWER_TOKEN)
            assert status == 200, (path, status)
            assert SECRET not in body and SECRET not in str(headers)
