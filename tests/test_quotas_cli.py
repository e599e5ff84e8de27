"""``budgetctl quota``: set, list, show, delete; bad rules exit 2 and change nothing."""

from __future__ import annotations

import json

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from tests.quota_procs import labelled


def _cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--redis", url, "quota", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_quota_commands(coord: Coordinator, redis_url: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, redis_url, "set", "user-day", "--match", "user=*",
                        "--usd", "0.05", "--actor", "ops")
    assert (code, out.strip()) == (0, "quota user-day set (version 1)")
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
    with ExecutionContext(config, metadata=labelled("ann"), coordinator=coord) as ctx:
        for _ in range(3):
            assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                     WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
    code, out, _ = _cli(capsys, redis_url, "list", "--json")
    listed = json.loads(out)
    assert listed["rules"] == ["user-day"]
    [bucket] = listed["buckets"]
    assert bucket["bucket"] == "user=ann" and bucket["spent"]["usd"] == 30_000
    assert bucket["in_grants"]["usd"] == 0 and bucket["limits"] == {"usd": 50_000}
    code, out, _ = _cli(capsys, redis_url, "list")
    assert "user=ann" in out and "$0.03" in out and "$0.05" in out
    code, out, _ = _cli(capsys, redis_url, "show", "user-day", "--json")
    shown = json.loads(out)
    assert shown["rule"]["usd"] == 0.05 and shown["audit"][0]["actor"] == "ops"
    code, _, err = _cli(capsys, redis_url, "set", "user-day", "--match", "user=*",
                        "--usd", "-1")
    assert code == 2 and "must not be negative" in err
    code, _, err = _cli(capsys, redis_url, "set", "user-day", "--match", "user=*",
                        "--usd", "1", "--period", "fortnight")
    assert code == 2 and "period" in err
    code, out, _ = _cli(capsys, redis_url, "show", "user-day", "--json")
    assert json.loads(out)["rule"]["usd"] == 0.05  # unchanged
    code, out, _ = _cli(capsys, redis_url, "delete", "user-day", "--actor", "ops")
    assert code == 0
    code, _, err = _cli(capsys, redis_url, "delete", "user-day")
    assert code == 1 and "no quota rule" in err
