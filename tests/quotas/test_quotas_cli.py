"""``budgetctl quota``: set, list, show, delete; bad rules exit 2 and change nothing; ids
whole at 80 columns, durations and times as a person reads them, dollars in ``*_usd``
fields, a limit changed without repeating the match (issue 29, item 14)."""

from __future__ import annotations

import json
import re

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
from tests.support.quota_procs import labelled


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
    assert bucket["bucket"] == "user=ann" and bucket["spent_usd"] == 0.03
    assert bucket["in_grants_usd"] == 0 and bucket["limit_usd"] == 0.05
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


def _spend_as(coord: Coordinator, user: str, usd: float) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
    with ExecutionContext(config, metadata=labelled(user), coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                                 WrapOptions(cost_estimate_hint=usd)) == Decision.ALLOW


def test_quota_list_at_80_columns_prints_ids_whole_and_durations_in_one_format(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    rule, user = "acc-cli-team-research-per-user-day", "ann-of-the-research-team"
    code, _, err = _cli(capsys, redis_url, "set", rule, "--match", "user=*", "--match",
                        "team=research", "--usd", "0.05", "--tokens", "100000")
    assert code == 0, err
    _spend_as(coord, user, 0.01)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _cli(capsys, redis_url, "list")
    assert code == 0 and "…" not in out, out
    assert rule in out and f"team=research,user={user}" in out, out
    assert not re.search(r"\d{3,}s\b", out), out  # 19h05m, never 68732s
    assert re.search(r"\b\d+h\d\dm\b|\b\d+m\d\ds\b|\b\d+s\b", out), out
    code, out, _ = _cli(capsys, redis_url, "list", "--json")
    [bucket] = json.loads(out)["buckets"]
    assert (bucket["spent_usd"], bucket["in_grants_usd"], bucket["limit_usd"]) == (
        0.01, 0, 0.05)
    assert (bucket["limit_tokens"], bucket["limit_calls"], bucket["spent_calls"]) == (
        100_000, None, 1)
    assert not {"spent", "in_grants", "limits"} & set(bucket)


def test_quota_set_changes_a_limit_without_repeating_the_match(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, redis_url, "set", "team-day", "--usd", "1")
    assert code == 2 and "--match" in err and "None" not in err, err  # a new rule needs one
    assert _cli(capsys, redis_url, "set", "team-day", "--match", "team=research", "--usd",
                "1", "--tokens", "5000", "--period", "week")[0] == 0
    code, _, err = _cli(capsys, redis_url, "set", "team-day")
    assert code == 2 and "nothing to set" in err, err
    code, out, err = _cli(capsys, redis_url, "set", "team-day", "--usd", "2.5")
    assert (code, out.strip()) == (0, "quota team-day set (version 2)"), err
    rule = json.loads(_cli(capsys, redis_url, "show", "team-day", "--json")[1])["rule"]
    assert (rule["match"], rule["usd"], rule["tokens"], rule["period"]) == (
        {"team": "research"}, 2.5, 5000, "week")
    assert _cli(capsys, redis_url, "set", "team-day", "--unset", "tokens")[0] == 0
    rule = json.loads(_cli(capsys, redis_url, "show", "team-day", "--json")[1])["rule"]
    assert (rule["usd"], rule["tokens"]) == (2.5, None)
    code, _, err = _cli(capsys, redis_url, "set", "team-day", "--match", "team=infra")
    assert code == 2 and "match" in err  # a rule's match cannot change


def test_quota_show_prints_audit_times_as_utc_dates(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(capsys, redis_url, "set", "user-day", "--match", "user=*", "--usd", "1",
                "--actor", "ops")[0] == 0
    code, out, _ = _cli(capsys, redis_url, "show", "user-day")
    assert code == 0 and not re.search(r"\d{12,}", out), out  # no epoch milliseconds
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ops set", out), out
    [event] = json.loads(_cli(capsys, redis_url, "show", "user-day", "--json")[1])["audit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["at"]), event
    assert "ts" not in event
