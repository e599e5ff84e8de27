"""The scripts around the budgets read stored numbers with lib/numbers.lua's strict parser too:
a budget window, a circuit breaker, a context's data size and an execution session whose
stored number is one Lua's tonumber would read but the project never writes fail closed
(refused, opened, raised, retired) instead of being read as a number."""

from __future__ import annotations

import uuid

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    PolicyContext,
    ToolCallContext,
)
from coordinator.core.data_keys import DataKeys
from coordinator.core.session_models import ExecutionSessionIdentity
from coordinator.errors import CorruptStateError
from coordinator.shield.breaker import BreakerState, CircuitBreaker
from coordinator.shield.windows import BudgetWindowHook
from coordinator.store.sessions import SessionStore

FORMS = ["0x10", " 5", "1e1", "+5", "5.0", "0x1p3", "007"]


def _call(team: str, estimate: float) -> ToolCallContext:
    return ToolCallContext(request_id="req", chain_id="chain", node_id=uuid.uuid4().hex,
                           kind="llm", team=team, cost_estimate_usd=estimate)


@pytest.mark.parametrize("value", FORMS)
def test_a_window_holding_a_non_canonical_amount_refuses(coord: Coordinator,
                                                         value: str) -> None:
    hook = BudgetWindowHook(scope="team", max_usd=0.10, window_s=60, coordinator=coord)
    assert hook.before_llm_call(_call("ml", 0.01)) is None
    calls_key, usd_key = hook.keys("ml")
    coord.client.set(usd_key, value)
    assert hook.before_llm_call(_call("ml", 0.01)) == Decision.HALT


@pytest.mark.parametrize("value", FORMS)
@pytest.mark.parametrize("field", ["failures", "opened_ms"])
def test_a_breaker_holding_a_non_canonical_number_opens(coord: Coordinator, field: str,
                                                        value: str) -> None:
    breaker = CircuitBreaker("corrupt:model", failure_threshold=5, recovery_timeout_s=30,
                             coordinator=coord)
    breaker.record_failure()
    coord.client.hset(breaker.key, field, value)
    assert not breaker.check(PolicyContext()).allowed
    assert breaker.state == BreakerState.OPEN
    assert coord.client.hget(breaker.key, "failures") == "0"  # written anew, canonical


@pytest.mark.parametrize("value", FORMS)
def test_context_data_with_a_non_canonical_size_is_refused(coord: Coordinator,
                                                           value: str) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=2)) as root:
        root.data.set("a", 1)
        meta = DataKeys(coord.keyspace).meta(root.chain_id, root.chain_id)
        coord.client.hset(meta, "bytes", value)
        with pytest.raises(CorruptStateError) as err:
            root.data.set("b", 2)
        assert err.value.value == value
        assert root.data.get("b") is None  # nothing written


FAR = ["0x7fffffffffff", " 99999999999999", "9e15", "+99999999999999",
       "99999999999999.0", "0x1p50"]  # an expiry far ahead, as tonumber reads them
ONE = [" 1", "+1", "1.0", "0x1", "01", "1e0", "0x1p0"]  # one execution so far


@pytest.mark.parametrize(("field", "value"), [("expires_at", v) for v in FAR]
                         + [("execution_count", v) for v in ONE])
def test_a_session_holding_a_non_canonical_number_is_retired(coord: Coordinator,
                                                             field: str, value: str) -> None:
    store = SessionStore(coord.client, prefix=coord.keyspace.prefix)
    who = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1", path_id="p1")
    assert store.acquire(who, cap=5, max_executions=10, claim_id="one",
                         claim_ttl_ms=5000).kind == "claimed"
    fields = {"tenant_id": "acme", "conversation_id": "c1", "path_id": "p1",
              "sandbox_id": "sb-1", "provider": "local", "host": "h", "connection": "{}"}
    assert store.commit(who, claim_id="one", ttl_ms=600_000, fields=fields) is not None
    coord.client.hset(store._keys(who).record(who.member), field, value)
    again = store.acquire(who, cap=5, max_executions=10, claim_id="two", claim_ttl_ms=5000)
    assert again.kind == "claimed" and again.retired_sandbox == "sb-1"
