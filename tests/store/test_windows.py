"""BudgetWindowHook: sliding windows on calls and USD per scope, exact across processes,
DEGRADE past the fraction, HALT at the limit, keys that expire when idle."""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from redis.crc import key_slot

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    ShieldPipeline,
    ToolCallContext,
    WrapOptions,
    report_usage,
)
from coordinator.embedded import RedisServer
from coordinator.errors import InvalidConfigError
from coordinator.shield.windows import BudgetWindowHook

SPAWN = mp.get_context("spawn")


def call(service: str = "search", *, kind: str = "llm", estimate: float = 0.0,
         **fields: Any) -> ToolCallContext:
    """The ToolCallContext of one new call (as ExecutionContext builds it)."""
    return ToolCallContext(request_id="req", chain_id="chain", node_id=uuid.uuid4().hex,
                           kind=kind, service=service, cost_estimate_usd=estimate, **fields)


# -- bodies of the worker processes ------------------------------------------------------


def fleet_worker(url: str, barrier: Any, out: Any) -> None:
    """One of 8 workers: ask a 50-calls-per-minute window for 20 calls, then hammer a
    50-calls-per-second window for 2.5 s, recording (Redis ms, admitted) per attempt."""
    coord = Coordinator.from_url(url)
    per_minute = BudgetWindowHook(scope="service", max_calls=50, window_s=60,
                                  name="per-minute", coordinator=coord)
    per_second = BudgetWindowHook(scope="service", max_calls=50, window_s=1.0,
                                  name="per-second", coordinator=coord)
    barrier.wait()
    decisions = [str(per_minute.before_llm_call(call()) or Decision.ALLOW)
                 for _ in range(20)]
    barrier.wait()
    end = time.monotonic() + 2.5
    seen = []
    while time.monotonic() < end:
        v = per_second.admit(call())
        seen.append((v.redis_ms, v.decision != Decision.HALT))
        time.sleep(0.002)
    out.put((decisions, seen))
    coord.close()


# -- across processes --------------------------------------------------------------------


@pytest.mark.slow
def test_eight_processes_share_windows_of_50_exactly(redis_url: str) -> None:
    barrier, out = SPAWN.Barrier(8), SPAWN.Queue()
    procs = [SPAWN.Process(target=fleet_worker, args=(redis_url, barrier, out))
             for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    decisions = Counter(d for r in results for d in r[0])
    # 160 attempts on the per-minute window: exactly 50 admitted, the 10 past 80% of
    # them with DEGRADE
    assert decisions == {str(Decision.ALLOW): 40, str(Decision.DEGRADE): 10,
                         str(Decision.HALT): 110}

    seen = [s for r in results for s in r[1]]
    admitted = sorted(ms for ms, ok in seen if ok)
    # no sliding 1-second window (by Redis time) ever holds more than 50 admissions
    for i, t in enumerate(admitted):
        in_window = i + 1 - sum(1 for u in admitted[: i + 1] if u <= t - 1000)
        assert in_window <= 50, f"{in_window} calls admitted in the second ending at {t}"
    # the first second is saturated (refusals came before it ended) and holds exactly 50
    first = admitted[0]
    assert any(not ok and ms < first + 1000 for ms, ok in seen)
    assert sum(1 for t in admitted if t < first + 1000) == 50
    # the window slides: calls are admitted again once the first ones leave it
    assert len(admitted) > 50


# -- one process -------------------------------------------------------------------------


def test_degrade_past_the_fraction_then_halt_at_the_limit(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="service", max_calls=10, window_s=60, coordinator=coord)
    got = [hook.before_llm_call(call()) for _ in range(12)]
    assert got == [None] * 8 + [Decision.DEGRADE] * 2 + [Decision.HALT] * 2
    half = BudgetWindowHook(scope="service", max_calls=4, window_s=60, degrade_at=0.5,
                            name="half", coordinator=coord)
    assert [half.before_llm_call(call()) for _ in range(5)] == [
        None, None, Decision.DEGRADE, Decision.DEGRADE, Decision.HALT]
    never = BudgetWindowHook(scope="service", max_calls=2, window_s=60, degrade_at=1.0,
                             name="never", coordinator=coord)
    assert [never.before_llm_call(call()) for _ in range(3)] == [None, None, Decision.HALT]


def test_a_call_degrades_on_the_calls_made_before_it(coord: Coordinator) -> None:
    """The reference's rule: DEGRADE once the calls already in the window number at least
    degrade_at x max_calls, so a product that is not a whole number does not degrade the
    call that reaches it."""
    def decisions(max_calls: int, degrade_at: float, n: int) -> list[Decision | None]:
        hook = BudgetWindowHook(scope="service", max_calls=max_calls, window_s=60,
                                degrade_at=degrade_at, name=f"w{max_calls}-{degrade_at}",
                                coordinator=coord)
        return [hook.before_llm_call(call()) for _ in range(n)]

    assert decisions(1, 0.8, 2) == [None, Decision.HALT]  # 0 calls before < 0.8
    assert decisions(3, 0.8, 4) == [None, None, None, Decision.HALT]  # 2 < 2.4: never
    assert decisions(7, 0.5, 8) == [None] * 4 + [Decision.DEGRADE] * 3 + [Decision.HALT]
    assert decisions(5, 0.8, 6) == [None] * 4 + [Decision.DEGRADE] + [Decision.HALT]


def test_a_one_call_window_lets_its_call_run_through_a_context(coord: Coordinator) -> None:
    pipeline = ShieldPipeline()
    BudgetWindowHook(scope="service", max_calls=1, window_s=60, pipeline=pipeline,
                     coordinator=coord)
    ran = []
    meta = ChainMetadata(request_id="r", chain_id="one-call", service="search")
    with ExecutionContext(ExecutionConfig(max_cost_usd=1, max_steps=10, max_retries_total=1),
                          pipeline, meta, coordinator=coord) as ctx:
        assert ctx.wrap_llm_call(lambda: ran.append(1)) == Decision.ALLOW
        assert ctx.wrap_llm_call(lambda: ran.append(2)) == Decision.HALT
    assert ran == [1]


def test_a_tool_window_is_charged_its_actual_cost_without_a_decision(
        coord: Coordinator) -> None:
    pipeline = ShieldPipeline()
    hook = BudgetWindowHook(scope="service", max_usd=0.10, window_s=60, kinds=("tool",),
                            pipeline=pipeline, coordinator=coord)
    meta = ChainMetadata(request_id="r", chain_id="tool-window", service="search")
    with ExecutionContext(ExecutionConfig(max_cost_usd=1, max_steps=10, max_retries_total=1),
                          pipeline, meta, coordinator=coord) as ctx:
        # $0.09 actual against a $0.01 estimate: past 80% of the window, yet the tool
        # call that ran is ALLOW (before_charge judges LLM calls only)
        assert ctx.wrap_tool_call(lambda: report_usage(cost_usd=0.09),
                                  WrapOptions(cost_estimate_hint=0.01)) == Decision.ALLOW
    assert hook.admit(call(kind="tool")).usd == pytest.approx(0.09)


def test_usd_window_holds_estimates_and_charges_actuals(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="team", max_usd=0.10, window_s=60, coordinator=coord)
    calls = [call(team="ml", estimate=0.03) for _ in range(4)]
    assert hook.before_llm_call(calls[0]) is None
    assert hook.before_llm_call(calls[1]) is None
    assert hook.before_llm_call(calls[2]) == Decision.DEGRADE  # $0.09 > 80% of $0.10
    assert hook.before_llm_call(calls[3]) == Decision.HALT  # $0.12 would pass $0.10
    # the first call cost $0.01, not its $0.03 estimate: room for the fourth now
    assert hook.before_charge(calls[0], 0.01) is None  # $0.07 in the window
    assert hook.before_llm_call(calls[3]) == Decision.DEGRADE  # $0.10
    assert hook.before_llm_call(call(team="ml")) == Decision.HALT  # at the maximum
    # an actual above the estimate counts too, and reports the window past its fraction
    other = call(team="ops", estimate=0.01)
    assert hook.before_llm_call(other) is None
    assert hook.before_charge(other, 0.09) == Decision.DEGRADE
    assert hook.admit(call(team="ops")).usd == pytest.approx(0.09)


def test_money_leaves_the_window_with_its_calls(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="team", max_usd=0.10, window_s=1.0, coordinator=coord)
    first = call(team="ml", estimate=0.05)
    assert hook.before_llm_call(first) is None
    assert hook.before_charge(first, 0.09) == Decision.DEGRADE  # past 80% of $0.10
    assert hook.admit(call(team="ml", estimate=0.02)).decision == Decision.HALT
    calls_key, usd_key = hook.keys("ml")
    assert 0 < coord.client.pttl(usd_key) <= 1000
    time.sleep(1.05)
    later = hook.admit(call(team="ml", estimate=0.07))
    assert later.decision == Decision.ALLOW and later.usd == pytest.approx(0.07)
    assert later.calls == 1


def test_scopes_count_separately_and_missing_values_share_one_bucket(
        coord: Coordinator) -> None:
    per_team = BudgetWindowHook(scope="team", max_calls=1, window_s=60, degrade_at=1.0,
                                coordinator=coord)
    assert per_team.before_llm_call(call(team="a")) is None
    assert per_team.before_llm_call(call(team="b")) is None
    assert per_team.before_llm_call(call(team="a")) == Decision.HALT
    per_user = BudgetWindowHook(scope="user", max_calls=1, window_s=60, degrade_at=1.0,
                                coordinator=coord)
    assert per_user.admit(call()).scope_value == "-"
    assert per_user.before_llm_call(call()) == Decision.HALT  # anonymous calls share "-"
    assert per_user.before_llm_call(call(user_id="u1")) is None
    per_model = BudgetWindowHook(scope="model", max_calls=1, window_s=60, degrade_at=1.0,
                                 coordinator=coord)
    assert per_model.before_llm_call(call(model="gpt-4o")) is None
    assert per_model.before_llm_call(call(model="gpt-4o-mini")) is None
    assert per_model.before_llm_call(call(model="gpt-4o")) == Decision.HALT


def test_only_the_configured_kinds_are_counted(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="service", max_calls=1, window_s=60, degrade_at=1.0,
                            coordinator=coord)
    for _ in range(3):
        assert hook.before_tool_call(call(kind="tool")) is None
    both = BudgetWindowHook(scope="service", max_calls=1, window_s=60, degrade_at=1.0,
                            kinds=("llm", "tool"), name="both", coordinator=coord)
    assert both.before_tool_call(call(kind="tool")) is None
    assert both.before_llm_call(call()) == Decision.HALT


def test_window_slides_and_its_keys_expire_when_idle(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="service", max_calls=2, window_s=1.0, degrade_at=1.0,
                            coordinator=coord)
    assert hook.before_llm_call(call()) is None
    assert hook.before_llm_call(call()) is None
    refused = hook.admit(call())
    assert refused.decision == Decision.HALT and 0 < refused.retry_after_ms <= 1000
    keys = hook.keys("search")
    assert 0 < coord.client.pttl(keys[0]) <= 1000
    assert coord.client.exists(keys[1]) == 0  # a call-count window keeps no USD key
    time.sleep(refused.retry_after_ms / 1000 + 0.05)
    assert hook.before_llm_call(call()) is None  # the first two left the window
    time.sleep(1.05)
    assert coord.client.exists(*keys) == 0


def test_keys_of_a_scope_share_one_hash_slot_whatever_the_value(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="team", max_calls=5, coordinator=coord)
    for value in ("ml", "we{ird}%", "}{"):
        calls_key, usd_key = hook.keys(value)
        assert key_slot(calls_key.encode()) == key_slot(usd_key.encode())
        assert calls_key.count("{") == 1 and calls_key.count("}") == 1
    assert hook.keys("a")[0] != hook.keys("b")[0]
    assert hook.before_llm_call(call(team="we{ird}%")) is None


@pytest.mark.parametrize("kwargs,field", [
    ({"max_calls": 0}, "max_calls"),
    ({"max_calls": -3}, "max_calls"),
    ({"max_calls": 2.5}, "max_calls"),
    ({"max_calls": None}, "max_calls"),
    ({"max_usd": 0.0, "max_calls": None}, "max_usd"),
    ({"max_usd": float("inf")}, "max_usd"),
    ({"window_s": 0}, "window_s"),
    ({"window_s": -1.0}, "window_s"),
    ({"degrade_at": 0.0}, "degrade_at"),
    ({"degrade_at": 1.5}, "degrade_at"),
    ({"degrade_at": float("nan")}, "degrade_at"),
    ({"scope": "planet"}, "scope"),
    ({"kinds": ("llm", "email")}, "kinds"),
    ({"name": "x{y"}, "name"),
])
def test_bad_configuration_raises_a_typed_error(coord: Coordinator, kwargs: dict[str, Any],
                                                field: str) -> None:
    args: dict[str, Any] = {"scope": "team", "max_calls": 10, **kwargs}
    with pytest.raises(InvalidConfigError) as err:
        BudgetWindowHook(coordinator=coord, **args)
    assert (field,) in [p["loc"] for p in err.value.problems]
    assert field in str(err.value)
    assert coord.client.dbsize() == 0


def test_script_cache_flush_is_survived(coord: Coordinator) -> None:
    hook = BudgetWindowHook(scope="service", max_calls=2, window_s=60, degrade_at=1.0,
                            coordinator=coord)
    assert hook.before_llm_call(call()) is None
    coord.client.script_flush()
    assert hook.before_llm_call(call()) is None
    coord.client.script_flush()
    assert hook.before_llm_call(call()) == Decision.HALT


def test_unreachable_redis_halts_with_an_event() -> None:
    server = RedisServer().start()
    coord = Coordinator.from_url(server.url)
    try:
        pipe = ShieldPipeline()
        hook = BudgetWindowHook(scope="service", max_calls=5, pipeline=pipe,
                                coordinator=coord)
        server.stop()
        assert pipe.before_llm_call(call()) == Decision.HALT
        [event] = pipe.get_events()
        assert event.event_type == "backend_unavailable" and event.hook == "BudgetWindowHook"
        assert hook.records_own_events
    finally:
        coord.close()
        server.stop()


# -- with an ExecutionContext ------------------------------------------------------------


def test_window_and_chain_ceiling_both_apply(coord: Coordinator) -> None:
    pipe = ShieldPipeline()
    BudgetWindowHook(scope="service", max_calls=3, window_s=60, degrade_at=1.0,
                     pipeline=pipe, coordinator=coord)
    config = ExecutionConfig(max_cost_usd=0.10, max_steps=100, max_retries_total=5)
    opts = WrapOptions(cost_estimate_hint=0.04)
    ran = []

    def spend() -> None:
        ran.append(1)
        report_usage(cost_usd=0.04)

    # the chain's ceiling stops the third call while the window still has room
    meta = ChainMetadata(request_id="r1", chain_id="tight", service="search")
    with ExecutionContext(config, pipe, meta) as tight:
        assert [tight.wrap_llm_call(spend, opts) for _ in range(3)] == [
            Decision.ALLOW, Decision.ALLOW, Decision.HALT]
        assert tight.get_snapshot().events[-1].event_type == "budget_exceeded"
    # the window (shared by the service) stops a chain whose ceiling still has room
    roomy_config = config.model_copy(update={"max_cost_usd": 10.0})
    meta = ChainMetadata(request_id="r2", chain_id="roomy", service="search")
    with ExecutionContext(roomy_config, pipe, meta) as roomy:
        assert [roomy.wrap_llm_call(spend, opts) for _ in range(2)] == [
            Decision.ALLOW, Decision.HALT]
        snap = roomy.get_snapshot()
        assert snap.events[-1].event_type == "provider_rate_limit"
        assert snap.cost_usd_accumulated == pytest.approx(0.04)
    assert len(ran) == 3
