"""Quota rules changed over the dashboard's JSON API (docs/dashboard.md): an operator's
change applies to the next call of a running tree and is audited under their name; bad
bodies and callers without the right are refused and change nothing."""

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
from coordinator.context.wrap import run_sync
from coordinator.quotas import QuotaRule, Quotas
from tests.support.dashboard_server import OPERATOR_TOKEN, VIEWER_TOKEN, dashboard
from tests.support.quota_procs import labelled

pytest.importorskip("starlette")

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
CALL = WrapOptions(cost_estimate_hint=0.01)


def _spend() -> None:
    report_usage(cost_usd=0.01)


def test_an_operator_changes_a_limit_and_the_next_call_obeys(coord: Coordinator,
                                                             redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=0.02,
                                retention_s=3600), actor="t")
    with dashboard(redis_url) as http:
        ctx = ExecutionContext(CONFIG, metadata=labelled("ann"), coordinator=coord)
        for _ in range(2):
            assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
        assert run_sync(ctx._state, ctx, "llm", _spend, CALL).reason == "quota_exceeded"
        listed = http.json("/api/quotas", token=VIEWER_TOKEN)
        assert [r["id"] for r in listed["rules"]] == ["user-day"]
        bucket = listed["buckets"][0]
        assert (bucket["bucket"], bucket["limit_usd"]) == ("user=ann", 0.02)

        status, _, body = http.request("PUT", "/api/quotas/user-day", token=OPERATOR_TOKEN,
                                       body={"usd": 0.05})
        assert status == 200, body
        rule = json.loads(body)["rule"]
        assert (rule["usd"], rule["version"]) == (0.05, 2)
        assert rule["retention_s"] == 3600  # a field not given keeps its value
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW  # at once
        ctx.close()  # gives back its grants: the bucket's spend is all reported

        shown = http.json("/api/quotas/user-day", token=VIEWER_TOKEN)
        assert [(a["actor"], a["action"]) for a in shown["audit"]] == [
            ("t", "set"), ("token-1 (dashboard)", "set")]
        assert shown["buckets"][0]["spent_usd"] == 0.03
        assert shown["buckets"][0]["in_grants_usd"] == 0


def test_refused_changes_leave_the_rule_as_it_was(coord: Coordinator,
                                                  redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="team-day", match={"team": "research"}, usd=5.0),
                      actor="t")
    path = "/api/quotas/team-day"
    with dashboard(redis_url) as http:
        assert http.request("PUT", path, body={"usd": 1})[0] == 401
        assert http.request("PUT", path, token=VIEWER_TOKEN, body={"usd": 1})[0] == 403
        assert http.request("DELETE", path, token=VIEWER_TOKEN)[0] == 403
        bad = {"usd": -1, "tokens": 1.5, "period": "fortnight", "tz": "Mars/Olympus",
               "colour": "red", "match": {"team": "infra"}}
        for field, value in bad.items():
            status, _, body = http.request("PUT", path, token=OPERATOR_TOKEN,
                                           body={field: value})
            assert status == 400, (field, body)
            assert field in json.loads(body)["error"] or field == "colour"
        status, _, body = http.request("PUT", path, token=OPERATOR_TOKEN, body=[1, 2])
        assert status == 400 and "JSON object" in body
        status, _, body = http.request("PUT", path, token=OPERATOR_TOKEN,
                                       body={"usd": None})  # no limit left
        assert status == 400 and "at least one" in body
        status, _, body = http.request(
            "PUT", path, token=OPERATOR_TOKEN, headers={"Content-Type": "application/json"},
            body=None)
        assert status == 400
        status, _, body = http.request("PUT", "/api/quotas/fresh", token=OPERATOR_TOKEN,
                                       body={"usd": 1})
        assert status == 400 and "needs a match" in body
        rule = Quotas(coord).get("team-day")
        assert (rule.usd, rule.version) == (5.0, 1)
        assert [a["actor"] for a in Quotas(coord).audit("team-day")] == ["t"]

        assert http.request("DELETE", path, token=OPERATOR_TOKEN)[0] == 200
        assert http.request("GET", path, token=OPERATOR_TOKEN)[0] == 404
        assert http.request("DELETE", path, token=OPERATOR_TOKEN)[0] == 404
        assert Quotas(coord).rules() == []


def test_the_quotas_page_says_when_a_window_resets_as_a_duration(coord: Coordinator,
                                                                 redis_url: str) -> None:
    Quotas(coord).set(QuotaRule(id="user-day", match={"user": "*"}, usd=1.0), actor="t")
    with ExecutionContext(CONFIG, metadata=labelled("ann"), coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(_spend, CALL) == Decision.ALLOW
    with dashboard(redis_url) as http:
        status, _, page = http.request("GET", "/quotas", token=VIEWER_TOKEN)
    assert status == 200, page
    resets = re.search(r"resets in ([^<]*)<", page)
    assert resets and re.fullmatch(r"\d+h\d\dm|\d+m\d\ds|\d+s", resets[1]), page  # 16h49m
