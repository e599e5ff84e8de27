"""Bad input to the shield's pieces: a typed error before anything reaches Redis, and an
egress check that fails closed."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
)
from coordinator.errors import InvalidConfigError
from coordinator.shield.breaker import CircuitBreaker
from coordinator.shield.egress import DenyListEgressHook
from coordinator.shield.pipeline import ToolCallContext
from coordinator.shield.windows import BudgetWindowHook

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=50, max_retries_total=5)
CALL = ToolCallContext(request_id="r", chain_id="c", node_id="n", kind="llm")


def _raises_config_error(coord: Coordinator, loc: tuple[Any, ...], make: Any) -> str:
    """Assert ``make()`` raises InvalidConfigError at ``loc`` and wrote nothing; its text."""
    with pytest.raises(InvalidConfigError) as err:
        make()
    assert loc in [p["loc"] for p in err.value.problems]
    assert ".".join(map(str, loc)) in str(err.value)
    assert coord.client.dbsize() == 0
    return str(err.value)


# -- 1. DenyListEgressHook's hosts ----------------------------------------------------------

@pytest.mark.parametrize("hosts,loc", [
    (None, ("hosts",)),
    (5, ("hosts",)),
    ([], ("hosts",)),
    (["a.com", "http://a.com/x"], ("hosts", 1)),
    (["a.com:80"], ("hosts", 0)),
    ([""], ("hosts", 0)),
    (["[::1]"], ("hosts", 0)),
    (["a..com"], ("hosts", 0)),
    (["a.com", 3], ("hosts", 1)),
])
def test_deny_list_rejects_what_is_not_a_bare_host(coord: Coordinator, hosts: Any,
                                                   loc: tuple[Any, ...]) -> None:
    _raises_config_error(coord, loc, lambda: DenyListEgressHook(hosts))


def test_deny_list_wildcard_and_pipeline_errors_say_what_to_do(coord: Coordinator) -> None:
    text = _raises_config_error(coord, ("hosts", 0), lambda: DenyListEgressHook(["*.a.com"]))
    assert "list 'a.com' instead" in text and "subdomains" in text
    _raises_config_error(coord, ("pipeline",),
                         lambda: DenyListEgressHook(["a.com"], pipeline="x"))  # type: ignore[arg-type]


def test_deny_list_accepts_host_names_and_ip_literals() -> None:
    hook = DenyListEgressHook([".Example.COM.", "10.0.0.1", "0:0::1"])
    assert hook.hosts == {"example.com", "10.0.0.1", "::1"}
    assert hook.denied_host("https://api.example.com:8443/x") == "example.com"
    assert hook.denied_host("http://10.0.0.1:8080/") == "10.0.0.1"
    assert hook.denied_host("http://[0::1]/") == "::1"
    assert hook.denied_host("http://10.0.0.2/") is None


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://127.1/", "http://2130706433/", "http://0x7f.0.0.1/",
    "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]/", "http://127.000.000.001/",
])
def test_a_listed_address_is_denied_however_it_is_spelled(url: str) -> None:
    hook = DenyListEgressHook(["127.1", "example.com"])  # listed as 127.0.0.1
    assert hook.hosts == {"127.0.0.1", "example.com"}
    assert hook.denied_host(url) == "127.0.0.1"
    assert hook.denied_host("http://127.0.0.2/") is None
    assert hook.denied_host("http://1.example.com/") == "example.com"


# -- 2. check_egress with a malformed URL or a non-string -----------------------------------

@pytest.mark.parametrize("url", ["http://[::1", "http://a.com:x/", "http://a.com:99999/"])
def test_malformed_url_is_refused_with_its_reason(coord: Coordinator, url: str) -> None:
    pipe = ShieldPipeline()
    DenyListEgressHook(["blocked.example"], pipeline=pipe)
    with ExecutionContext(CONFIG, pipe, coordinator=coord) as ctx:
        assert ctx.check_egress(url) == Decision.HALT
        [event] = [e for e in ctx.get_snapshot().events if e.event_type == "egress_denied"]
        assert event.decision == Decision.HALT
        assert event.reason == f"egress to {url!r} refused: the URL is malformed"
        assert ctx.check_egress("https://allowed.example/") == Decision.ALLOW


@pytest.mark.parametrize("url", [5, None, b"http://a.com/"])
def test_non_string_url_raises_type_error(coord: Coordinator, url: Any) -> None:
    pipe = ShieldPipeline()
    DenyListEgressHook(["blocked.example"], pipeline=pipe)
    with ExecutionContext(CONFIG, pipe, coordinator=coord) as ctx:
        with pytest.raises(TypeError, match="url must be a str"):
            ctx.check_egress(url)
    with ExecutionContext(CONFIG, coordinator=coord) as bare:  # no pipeline: still checked
        with pytest.raises(TypeError, match="url must be a str"):
            bare.check_egress(url)


# -- 3. BudgetWindowHook --------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,loc", [
    ({"window_s": 1e15}, ("window_s",)),
    ({"window_s": 30 * 24 * 3600 + 1}, ("window_s",)),
    ({"window_s": 10**400}, ("window_s",)),
    ({"window_s": True}, ("window_s",)),
    ({"degrade_at": 10**400}, ("degrade_at",)),
    ({"max_calls": 10**16}, ("max_calls",)),
    ({"max_usd": 1e300}, ("max_usd",)),
    ({"scope": ["team"]}, ("scope",)),
    ({"circuit_breaker": "x"}, ("circuit_breaker",)),
    ({"pipeline": "x"}, ("pipeline",)),
    ({"coordinator": "x"}, ("coordinator",)),
])
def test_window_rejects_out_of_range_and_mistyped_arguments(
        coord: Coordinator, kwargs: dict[str, Any], loc: tuple[str]) -> None:
    args: dict[str, Any] = {"max_calls": 10, "coordinator": coord, **kwargs}
    _raises_config_error(coord, loc, lambda: BudgetWindowHook(**args))


def test_window_of_30_days_works(coord: Coordinator) -> None:
    hook = BudgetWindowHook(max_calls=1, window_s=30 * 24 * 3600, coordinator=coord)
    assert hook.admit(CALL).decision == Decision.ALLOW  # no call before it: not degraded
    verdict = hook.admit(ToolCallContext(request_id="r", chain_id="c", node_id="m",
                                         kind="llm"))
    assert verdict.decision == Decision.HALT
    assert 0 < verdict.retry_after_ms <= 30 * 24 * 3600 * 1000


# -- 4. CircuitBreaker ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,loc", [
    ({"recovery_timeout_s": 1e300}, ("recovery_timeout_s",)),
    ({"recovery_timeout_s": 24 * 3600 + 1}, ("recovery_timeout_s",)),
    ({"recovery_timeout_s": 10**400}, ("recovery_timeout_s",)),
    ({"recovery_timeout_s": True}, ("recovery_timeout_s",)),
    ({"failure_threshold": 10**16}, ("failure_threshold",)),
    ({"failure_threshold": True}, ("failure_threshold",)),
    ({"coordinator": "x"}, ("coordinator",)),
])
def test_breaker_rejects_out_of_range_and_mistyped_arguments(
        coord: Coordinator, kwargs: dict[str, Any], loc: tuple[str]) -> None:
    args: dict[str, Any] = {"coordinator": coord, **kwargs}
    _raises_config_error(coord, loc, lambda: CircuitBreaker("openai", **args))


def test_breaker_takes_no_pipeline(coord: Coordinator) -> None:
    with pytest.raises(TypeError, match="pipeline"):
        CircuitBreaker("openai", pipeline="x", coordinator=coord)  # type: ignore[call-arg]
    assert coord.client.dbsize() == 0


def test_breaker_with_a_one_day_recovery_opens_and_stays_open(coord: Coordinator) -> None:
    b = CircuitBreaker("openai", failure_threshold=1, recovery_timeout_s=24 * 3600,
                       coordinator=coord)
    assert b.check().allowed
    b.record_failure()
    decision = b.check()
    assert not decision.allowed and "is OPEN" in decision.reason
    assert 0 < coord.client.pttl(b.key) <= 2 * 24 * 3600 * 1000
