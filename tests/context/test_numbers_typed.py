"""Every number a user can give (a quota rule, a context's limits, a call's options, a
usage report, ``budgetctl quota set``'s options, the dashboard's quota body) gets the
typed error of its kind for any int, float or string, and the largest values accepted
work end to end: nothing overflows, nothing is stored that the scripts cannot read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    TokenBudget,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from coordinator.core.pricing import clear_prices, load_price_table, set_price
from coordinator.data.values import DataLimits
from coordinator.errors import (
    InvalidConfigError,
    InvalidCostError,
    InvalidUsageError,
    QuotaRuleError,
    ReportOutsideCallError,
    TopologySettingError,
)
from coordinator.quotas import QuotaRule, Quotas
from tests.support.quota_procs import labelled

NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2 ** 53 - 2, max_value=10 ** 500),
    st.integers(min_value=-(10 ** 500), max_value=-(2 ** 53)),
    st.floats(),  # NaN and infinities included
    st.booleans(),
    st.text(max_size=12),
    st.from_regex(r"\A-?[0-9]{1,400}(\.[0-9]{0,3})?(e[+-]?[0-9]{1,4})?\Z"),
)
PERIODS = st.one_of(st.from_regex(r"\A[0-9]{1,12}[smhd]\Z"), st.text(max_size=12))
RULE = {"id": "r", "match": {"team": "research"}, "usd": 1.0}
RULE_FIELDS = ("usd", "tokens", "calls", "retention_s", "grant_fraction")
LIMITS = {"max_cost_usd": 1.0, "max_steps": 5, "max_retries_total": 1}
CALL = WrapOptions(cost_estimate_hint=0.01)
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(field=st.sampled_from(RULE_FIELDS), value=NUMBERS)
def test_a_rule_number_is_accepted_or_refused_typed(field: str, value: Any) -> None:
    try:
        QuotaRule(**{**RULE, field: value})
    except QuotaRuleError as exc:
        assert exc.field == field


@FUZZ
@given(period=PERIODS)
def test_a_rule_period_is_accepted_or_refused_typed(period: str) -> None:
    try:
        QuotaRule(**{**RULE, "period": period})
    except QuotaRuleError as exc:
        assert exc.field == "period"


_MODELS: list[tuple[Any, dict[str, Any], str]] = [
    *((ExecutionConfig, LIMITS, f) for f in ("max_cost_usd", "max_steps",
                                             "max_retries_total", "timeout_ms")),
    *((TokenBudget, {}, f) for f in ("total", "input", "output")),
    *((WrapOptions, {}, f) for f in ("cost_estimate_hint", "input_tokens_estimate",
                                     "max_output_tokens", "timeout_ms")),
    *((LeasePolicy, {}, f) for f in LeasePolicy.model_fields
      if f in ("usd", "steps", "tokens", "max_age_ms")),
]


@FUZZ
@given(model=st.sampled_from(_MODELS), value=NUMBERS)
def test_a_limit_or_option_is_accepted_or_refused_typed(model: tuple[Any, dict[str, Any],
                                                                      str],
                                                        value: Any) -> None:
    cls, base, field = model
    try:
        cls(**{**base, field: value})
    except InvalidConfigError:
        pass


@FUZZ
@given(field=st.sampled_from(["cost_usd", "input_tokens", "output_tokens"]),
       value=NUMBERS)
def test_a_usage_report_is_accepted_or_refused_typed(field: str, value: Any) -> None:
    try:
        report_usage(**{field: value})
    except ReportOutsideCallError:
        pass  # the value was accepted: only the call is missing
    except (InvalidCostError, InvalidUsageError):
        pass


@FUZZ
@given(field=st.sampled_from(["input_per_mtok", "output_per_mtok", "cache_read_per_mtok"]),
       value=NUMBERS)
def test_a_price_is_accepted_or_refused_typed(field: str, value: Any) -> None:
    try:
        set_price("fuzzed-model", **{"input_per_mtok": 1.0, "output_per_mtok": 1.0,
                                     field: value})
    except InvalidUsageError as exc:
        assert field in str(exc)
    finally:
        clear_prices()


@pytest.fixture
def default_prices_after() -> Iterator[None]:
    """The default price table loaded again once the test is done (hypothesis runs every
    example inside one use of a fixture; each example loads a table of its own)."""
    yield
    load_price_table()


@FUZZ
@given(column=st.integers(min_value=1, max_value=4), value=NUMBERS)
def test_a_price_table_row_is_accepted_or_refused_typed(tmp_path_factory: Any,
                                                        default_prices_after: None,
                                                        column: int, value: Any) -> None:
    row: list[Any] = ["openai", 1.0, 2.0, None, None]
    row[column] = value
    path = tmp_path_factory.mktemp("prices") / "table.json"
    path.write_text(json.dumps({"_meta": {"source": "fuzz"}, "models": {"m": row}}))
    try:
        load_price_table(path)
    except InvalidUsageError as exc:
        assert "price table" in str(exc)
    else:  # accepted: a price a call can be charged at
        assert type(value) in (int, float) and 0 <= value <= 1e6


@FUZZ
@given(field=st.sampled_from(["max_key_chars", "max_value_bytes", "max_context_bytes"]),
       value=NUMBERS)
def test_data_limits_are_accepted_or_refused_typed(field: str, value: Any) -> None:
    try:
        DataLimits(**{field: value})
    except InvalidConfigError as exc:
        assert field in str(exc)
    else:  # accepted: a whole number the scripts hold exactly
        assert type(value) is int and 1 <= value < 2 ** 53


@pytest.mark.parametrize("value", ["abc", "9" * 400, "-1", "0", "1e3"])
def test_data_limits_from_the_environment_are_refused_typed(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGET_DATA_MAX_VALUE_BYTES", value)
    with pytest.raises(InvalidConfigError, match="BUDGET_DATA_MAX_VALUE_BYTES"):
        DataLimits.from_env()


def test_tokens_priced_beyond_any_ceiling_are_charged_not_raised(coord: Coordinator) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=1)
    with ExecutionContext(config, coordinator=coord) as ctx:
        # 10**15 tokens (the most a report may give) at gpt-4o's price: $2.5 billion
        decision = ctx.wrap_llm_call(lambda: report_usage(input_tokens=10 ** 15,
                                                          model="gpt-4o"), CALL)
        assert decision == Decision.ALLOW  # it ran: charged (at the most a cost can be)
        assert ctx.get_snapshot().cost_usd_accumulated == 1e9
        assert ctx.stop_reason == "budget_exceeded"


@FUZZ
@given(env=st.sampled_from(["BUDGET_ALERT_FRACTIONS", "BUDGET_ALERT_BURN_USD_PER_MIN",
                            "BUDGET_ALERT_RULES"]), value=NUMBERS)
def test_alert_settings_are_accepted_or_refused_typed(env: str, value: Any) -> None:
    pytest.importorskip("starlette")
    from coordinator.dashboard.alerts import rules_from_env

    text = (json.dumps([{"fractions": [value]}, {"burn_usd_per_min": value}])
            if env == "BUDGET_ALERT_RULES" else str(value))
    try:
        rules = rules_from_env({env: text})
    except InvalidConfigError as exc:
        assert env in str(exc)
    else:  # accepted: thresholds an alert can cross
        for rule in rules:
            assert all(0 < f <= 1000 for f in rule.fractions)
            assert rule.burn_usd_per_min is None or 0 <= rule.burn_usd_per_min <= 1e9


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "9" * 400, "0", "-1", "abc"])
def test_the_dashboards_sweep_setting_is_refused_typed(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette")
    from coordinator.dashboard.command import sweep_from_env

    monkeypatch.setenv("BUDGET_DASHBOARD_SWEEP_S", value)
    with pytest.raises(InvalidConfigError, match="BUDGET_DASHBOARD_SWEEP_S"):
        sweep_from_env()


@pytest.mark.parametrize("port", ["9" * 400, "70000", "0", "-1", "http"])
def test_python_m_dashboard_refuses_a_bad_port_with_exit_2(
        port: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("starlette")
    from coordinator.dashboard.command import main as dashboard_main

    with pytest.raises(SystemExit) as exited:
        dashboard_main(["--port", port])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


SETTINGS = ("lease_ms", "retention_s", "hot_timeout_ms", "long_timeout_ms",
            "probe_interval_ms", "replicas", "wait_timeout_ms")


@settings(FUZZ, max_examples=100)
@given(name=st.sampled_from(SETTINGS), value=NUMBERS)
def test_a_coordinator_setting_is_accepted_or_refused_typed(redis_url: str, name: str,
                                                             value: Any) -> None:
    try:
        coord = Coordinator.from_url(redis_url, **{name: value})
    except TopologySettingError as exc:
        assert exc.setting == name
    else:
        coord.close()


@pytest.mark.parametrize("value", ["abc", "9" * 400, "-1", "1e3", "0x10", " 5"])
def test_a_coordinator_setting_from_the_environment_is_refused_typed(
        redis_url: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("BUDGET_LEASE_MS", "BUDGET_LONG_TIMEOUT_MS", "BUDGET_REPLICAS"):
        with monkeypatch.context() as m:
            m.setenv(env, value)
            with pytest.raises(TopologySettingError, match=env):
                Coordinator.from_url(redis_url)


@pytest.mark.parametrize("change", [
    {"period": "36500d", "retention_s": 36500 * 86400},  # the longest window, retention
    {"period": "876000h"},
    {"usd": 9_007_199_254.740991},  # the largest limit exact in micro-dollars
    {"calls": 2 ** 53 - 1, "usd": None},
])
def test_the_largest_rule_accepted_serves_calls(coord: Coordinator,
                                                change: dict[str, Any]) -> None:
    Quotas(coord).set(QuotaRule(**{**RULE, "match": {"user": "*"}, **change}), actor="t")
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=1)
    with ExecutionContext(config, metadata=labelled("ann"), coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.01),
                                 WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW


@pytest.mark.parametrize(("option", "value"), [
    ("--usd", "1" + "0" * 400), ("--usd", "1e400"), ("--usd", "nan"),
    ("--tokens", "9" * 400), ("--calls", "-" + "9" * 400),
    ("--retention", "9" * 400), ("--retention", str(2 ** 53 - 1)),
    ("--period", "999999999d"), ("--period", "36501d"),
])
def test_quota_set_refuses_huge_numbers_with_exit_2(redis_url: str, option: str, value: str,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    code = main(["--redis", redis_url, "quota", "set", "r", "--match", "user=*",
                 "--usd", "1", option, value])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert option.lstrip("-").replace("retention", "retention_s") in err


@pytest.mark.parametrize("args", [
    ["top", "--limit", "9" * 30], ["top", "--limit", "9" * 400],
    ["top", "--json", "--watch", "inf"], ["top", "--json", "--watch", "1e400"],
    ["gc", "--dry-run", "--idle", "inf"], ["gc", "--dry-run", "--idle", "9" * 400],
    ["dashboard", "--port", "9" * 400], ["dashboard", "--port", "70000"],
])
def test_budgetctl_options_refuse_huge_numbers_with_exit_2(
        redis_url: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--redis", redis_url, *args])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert f"Invalid value for '{args[-2]}'" in err


def test_the_dashboard_refuses_huge_numbers_in_bodies_and_queries(coord: Coordinator,
                                                            redis_url: str) -> None:
    pytest.importorskip("starlette")
    from tests.support.dashboard_server import OPERATOR_TOKEN, dashboard

    Quotas(coord).set(QuotaRule(**RULE), actor="t")
    with dashboard(redis_url) as http:
        for field in ("usd", "tokens", "calls", "retention_s", "grant_fraction"):
            for value in (10 ** 400, -(10 ** 400), float("inf")):  # 1e400 reads as inf
                status, _, body = http.request("PUT", "/api/quotas/r", token=OPERATOR_TOKEN,
                                               body={field: value})
                assert status == 400, (field, value, body)
                assert field in json.loads(body)["error"]
        for since in ("nan", "inf", "1e400", "-inf"):  # a read's freshness, in Unix ms
            status, _, body = http.request("GET", f"/api/trees?since={since}",
                                           token=OPERATOR_TOKEN)
            assert status == 400 and "since" in body, (since, body)
        for period in ("999999999d", "104250d"):
            status, _, body = http.request("PUT", "/api/quotas/r", token=OPERATOR_TOKEN,
                                           body={"period": period})
            assert status == 400 and "period" in body
    assert Quotas(coord).get("r").version == 1
