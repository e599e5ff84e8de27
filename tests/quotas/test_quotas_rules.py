"""Quota rules: bad rules refused with typed errors and nothing changed in Redis; periods
(calendar windows in a time zone, fixed windows, total); matching by labels."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from coordinator import Coordinator
from coordinator.core.quota_keys import QuotaKeys
from coordinator.errors import BudgetCoordinatorError, QuotaNotFoundError, QuotaRuleError
from coordinator.quotas import QuotaRule, Quotas, window_at

GOOD: dict[str, Any] = {"id": "team-day", "match": {"team": "research"}, "usd": 1.0}


@pytest.mark.parametrize(("change", "field"), [
    ({"usd": math.nan}, "usd"),
    ({"usd": math.inf}, "usd"),
    ({"usd": -0.01}, "usd"),
    ({"usd": 1e10}, "usd"),
    ({"usd": "1"}, "usd"),
    ({"usd": True}, "usd"),
    ({"tokens": -1}, "tokens"),
    ({"tokens": 2 ** 53}, "tokens"),
    ({"calls": 1.5}, "calls"),
    ({"usd": None}, "limits"),
    ({"period": "fortnight"}, "period"),
    ({"period": "0s"}, "period"),
    ({"tz": "Mars/Olympus"}, "tz"),
    ({"match": {}}, "match"),
    ({"match": {"team": ""}}, "match"),
    ({"match": {"bad label": "x"}}, "match"),
    ({"id": "no spaces"}, "id"),
    ({"retention_s": 0}, "retention_s"),
    ({"grant_fraction": 0.0}, "grant_fraction"),
])
def test_bad_rules_are_refused_with_typed_errors(change: dict[str, Any], field: str) -> None:
    with pytest.raises(QuotaRuleError) as err:
        QuotaRule(**{**GOOD, **change})
    assert err.value.field == field
    assert isinstance(err.value, BudgetCoordinatorError)


def test_a_bad_rule_changes_nothing_in_redis(coord: Coordinator) -> None:
    quotas = Quotas(coord)
    quotas.set(QuotaRule(**GOOD), actor="test")
    before = {k: coord.client.dump(k) for k in coord.client.keys("*")}
    for change in ({"usd": math.nan}, {"usd": -1.0}, {"period": "yearly"}, {"match": {}}):
        with pytest.raises(QuotaRuleError):
            quotas.set(QuotaRule(**{**GOOD, **change}), actor="test")
    with pytest.raises(QuotaRuleError):  # a match cannot change: delete and create
        quotas.set(QuotaRule(**{**GOOD, "match": {"team": "other"}}), actor="test")
    with pytest.raises(QuotaNotFoundError):
        quotas.delete("no-such-rule", actor="test")
    after = {k: coord.client.dump(k) for k in coord.client.keys("*")
             if not k.endswith(":audit")}
    assert after == {k: v for k, v in before.items() if not k.endswith(":audit")}
    assert quotas.get("team-day").usd == 1.0
    assert len(quotas.audit("team-day")) == 1


def test_set_list_get_delete(coord: Coordinator) -> None:
    quotas = Quotas(coord)
    stored = quotas.set(QuotaRule(**GOOD), actor="alice")
    assert stored.version == 1
    assert quotas.set(QuotaRule(**{**GOOD, "usd": 2.0}), actor="bob").version == 2
    assert [r.id for r in quotas.rules()] == ["team-day"]
    assert quotas.get("team-day").limits == {"usd": 2_000_000}
    quotas.delete("team-day", actor="carol")
    assert quotas.rules() == []
    with pytest.raises(QuotaNotFoundError):
        quotas.get("team-day")
    assert [a["actor"] for a in quotas.audit("team-day")] == ["alice", "bob", "carol"]
    assert not coord.client.exists(QuotaKeys(coord.keyspace).rule("team-day"))


def _ms(text: str, tz: str = "UTC") -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def test_calendar_windows_in_a_time_zone() -> None:
    # 23:30 in Paris on Nov 26 is 22:30 UTC: still the 26th there, the 27th nowhere yet
    at = _ms("2026-11-26T22:30:00")
    day = window_at("day", "Europe/Paris", at)
    assert day.id == "2026-11-26"
    assert day.start_ms == _ms("2026-11-26T00:00:00", "Europe/Paris")
    assert day.end_ms == _ms("2026-11-27T00:00:00", "Europe/Paris")
    assert window_at("day", "UTC", _ms("2026-11-26T23:30:00", "Europe/Paris")).id == \
        "2026-11-26"
    assert window_at("day", "Europe/Paris", _ms("2026-11-26T23:30:00")).id == "2026-11-27"
    week = window_at("week", "UTC", at)
    assert week.id == "2026-W48" and week.start_ms == _ms("2026-11-23T00:00:00")
    month = window_at("month", "UTC", at)
    assert month.id == "2026-11" and month.end_ms == _ms("2026-12-01T00:00:00")
    # a DST change: the Paris day of 2026-03-29 lasts 23 hours
    dst = window_at("day", "Europe/Paris", _ms("2026-03-29T12:00:00", "Europe/Paris"))
    assert dst.end_ms - dst.start_ms == 23 * 3600 * 1000


def test_fixed_and_total_windows() -> None:
    w = window_at("30s", "UTC", 95_000)
    assert (w.start_ms, w.end_ms) == (90_000, 120_000)
    assert window_at("30s", "UTC", 119_999).id == w.id != window_at("30s", "UTC", 120_000).id
    assert window_at("total", "UTC", 123).end_ms == 0


def test_matching_by_labels_and_wildcards() -> None:
    rule = QuotaRule(id="u", match={"team": "research", "user": "*"}, usd=1.0)
    assert rule.bucket_of({"team": "research", "user": "ann"}) == "team=research,user=ann"
    assert rule.bucket_of({"team": "research"}) is None
    assert rule.bucket_of({"team": "ops", "user": "ann"}) is None
    key = QuotaRule(id="k", match={"key": "sk-1"}, usd=50.0, period="total")
    assert key.bucket_of({"key": "sk-1"}) == "key=sk-1"
    # a value holding the separators of bucket names and grant members is escaped
    assert rule.bucket_of({"team": "research", "user": "a|b,c%"}) == \
        "team=research,user=a%7Cb%2Cc%25"
