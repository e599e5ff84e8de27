"""CircuitBreaker: state shared through Redis by every process naming the breaker; one
HALF_OPEN probe across the fleet; a dead probe holder does not wedge it."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import time
from typing import Any

import pytest
import redis

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, PolicyContext
from coordinator.embedded import RedisServer
from coordinator.errors import InvalidConfigError
from coordinator.shield.breaker import BreakerState, CircuitBreaker

SPAWN = mp.get_context("spawn")
NAME = "openai:gpt-4o"


def _wait_for(pred: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


# -- bodies of the worker processes (spawned: each has its own Coordinator) -------------


def fleet_worker(url: str, recovery_s: float, barrier: Any, out: Any) -> None:
    """One of 4 workers: fail once, see the breaker open, race for the probe, and see the
    probe's success close it."""
    coord = Coordinator.from_url(url)
    b = CircuitBreaker(NAME, failure_threshold=4, recovery_timeout_s=recovery_s,
                       coordinator=coord)
    res: dict[str, Any] = {"pid": os.getpid()}
    barrier.wait()
    res["first"] = b.check(PolicyContext()).allowed
    b.record_failure()
    barrier.wait()  # all 4 failures recorded
    res["after_failures"] = b.check(PolicyContext()).allowed
    res["state_after_failures"] = b.state.value
    barrier.wait()
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN, timeout=30)
    barrier.wait()
    probe = b.check(PolicyContext())
    res["probe"] = probe.allowed
    res["probe_reason"] = probe.reason
    barrier.wait()  # every worker has asked for the probe
    if probe.allowed:
        b.record_success()
    barrier.wait()
    res["after_probe"] = b.check(PolicyContext()).allowed
    res["state_after_probe"] = b.state.value
    out.put(res)
    coord.close()


def take_probe_and_die(url: str, recovery_s: float) -> None:
    """Take the HALF_OPEN probe, then exit without reporting (a worker that died)."""
    coord = Coordinator.from_url(url)
    b = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=recovery_s,
                       coordinator=coord)
    assert b.check().allowed
    os._exit(0)


def hold_probe(url: str, lease_s: float, ready: Any, go: Any, done: Any) -> None:
    """Take the HALF_OPEN probe and run it until told to report its failure (the test may
    SIGKILL or SIGSTOP this process meanwhile)."""
    coord = Coordinator.from_url(url)
    b = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.2,
                       probe_lease_s=lease_s, coordinator=coord)
    assert b.check().allowed  # the probe
    ready.set()
    go.wait()
    b.record_failure()
    done.set()
    coord.close()


def _stored_state(coord: Coordinator, b: CircuitBreaker) -> str:
    """The state as last written (an OPEN breaker's recovery timeout may pass before a
    busy test machine reads ``state``, which then says HALF_OPEN)."""
    return str(coord.client.hget(b.key, "state") or "CLOSED")


def _half_open(coord: Coordinator, lease_s: float) -> CircuitBreaker:
    """A breaker opened by one failure and HALF_OPEN now (its recovery timeout: 0.2 s)."""
    b = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.2,
                       probe_lease_s=lease_s, coordinator=coord)
    assert b.check().allowed
    b.record_failure()
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN)
    return b


# -- tests -------------------------------------------------------------------------------


def test_a_probe_running_longer_than_the_recovery_timeout_keeps_it(coord: Coordinator) -> None:
    """The probe is held until its holder reports (its lease is renewed meanwhile): no
    second caller gets through, and the probe's late failure opens the breaker again."""
    b = _half_open(coord, lease_s=1.0)  # renewed every 1/3 s
    other = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=0.2,
                           probe_lease_s=1.0, coordinator=coord)
    assert b.check().allowed  # the probe, for a call 15 recovery timeouts, 3 leases long
    for _ in range(10):
        time.sleep(0.3)
        refused = other.check()
        assert not refused.allowed and "HALF_OPEN" in refused.reason
    b.record_failure()
    assert _stored_state(coord, b) == "OPEN"
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN)
    assert other.check().allowed  # a new probe, 3 s long, that succeeds
    time.sleep(3.0)
    assert not b.check().allowed
    other.record_success()
    assert b.state == BreakerState.CLOSED


def test_a_killed_probe_holder_frees_the_probe_after_its_lease(
        coord: Coordinator, redis_url: str) -> None:
    b = _half_open(coord, lease_s=1.0)
    ready, go, done = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    p = SPAWN.Process(target=hold_probe, args=(redis_url, 1.0, ready, go, done))
    p.start()
    assert ready.wait(60)
    time.sleep(3.0)  # three leases: the holder's process renews its lease
    assert not b.check().allowed
    p.kill()  # SIGKILL: nobody renews the lease any more
    p.join(30)
    _wait_for(lambda: b.check().allowed, timeout=10)  # the probe passed to us
    b.record_success()
    assert b.state == BreakerState.CLOSED


def test_a_lapsed_probes_failure_still_counts(coord: Coordinator, redis_url: str) -> None:
    """A holder paused past its lease (SIGSTOP) loses the probe to another caller, but the
    failure it reports when it resumes still opens the breaker."""
    b = _half_open(coord, lease_s=0.3)
    ready, go, done = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    p = SPAWN.Process(target=hold_probe, args=(redis_url, 0.3, ready, go, done))
    p.start()
    assert ready.wait(60)
    assert p.pid is not None
    os.kill(p.pid, signal.SIGSTOP)
    try:
        _wait_for(lambda: b.check().allowed, timeout=10)  # its lease lapsed: ours now
    finally:
        os.kill(p.pid, signal.SIGCONT)
    go.set()
    assert done.wait(60)
    p.join(30)
    assert p.exitcode == 0
    assert _stored_state(coord, b) == "OPEN"  # the paused probe failed: OPEN again
    b.record_success()  # our probe's success arrives after that: it changes nothing
    assert _stored_state(coord, b) == "OPEN"


def test_four_processes_see_it_open_together_and_exactly_one_probe(redis_url: str) -> None:
    barrier, out = SPAWN.Barrier(4), SPAWN.Queue()
    procs = [SPAWN.Process(target=fleet_worker, args=(redis_url, 3.0, barrier, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert all(r["first"] for r in results)
    # each worker failed once; the fourth failure (fleet-wide) opened it for everyone
    assert [r["after_failures"] for r in results] == [False] * 4
    assert {r["state_after_failures"] for r in results} == {"OPEN"}
    # exactly one process got the probe; the others were told a probe is in flight
    assert sorted(r["probe"] for r in results) == [False, False, False, True]
    refused = [r["probe_reason"] for r in results if not r["probe"]]
    assert all("HALF_OPEN" in reason for reason in refused)
    # the probe's success closed it for all
    assert all(r["after_probe"] for r in results)
    assert {r["state_after_probe"] for r in results} == {"CLOSED"}


def test_dead_probe_holder_frees_the_probe_after_recovery_timeout(
        coord: Coordinator, redis_url: str) -> None:
    # the recovery timeout leaves room for a slow process start on a loaded machine
    b = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=2.0, coordinator=coord)
    assert b.check().allowed
    b.record_failure()
    assert b.state == BreakerState.OPEN
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN)
    p = SPAWN.Process(target=take_probe_and_die, args=(redis_url, 2.0))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    refused = b.check()
    assert not refused.allowed and "probe" in refused.reason
    # the dead worker's probe expires after the recovery timeout and passes to us
    _wait_for(lambda: b.check().allowed)
    b.record_success()
    assert b.state == BreakerState.CLOSED


def test_failed_probe_opens_it_again(coord: Coordinator) -> None:
    b = CircuitBreaker(NAME, failure_threshold=2, recovery_timeout_s=1.0, coordinator=coord)
    other = CircuitBreaker(NAME, failure_threshold=2, recovery_timeout_s=1.0,
                           coordinator=coord)
    for _ in range(2):
        assert b.check().allowed
        b.record_failure()
    assert not other.check().allowed
    _wait_for(lambda: b.state == BreakerState.HALF_OPEN)
    assert b.check().allowed  # the probe
    b.record_failure()
    assert b.state == BreakerState.OPEN
    decision = other.check()
    assert not decision.allowed and "OPEN" in decision.reason


def test_success_resets_consecutive_failures(coord: Coordinator) -> None:
    b = CircuitBreaker(NAME, failure_threshold=3, coordinator=coord)
    for outcome in ("f", "f", "s", "f", "f"):
        assert b.check().allowed
        b.record_failure() if outcome == "f" else b.record_success()
    assert b.state == BreakerState.CLOSED and b.failure_count == 2
    assert b.check().allowed
    b.record_failure()
    assert b.state == BreakerState.OPEN and b.failure_count == 3


def test_late_outcomes_of_calls_sent_before_it_opened_change_nothing(
        coord: Coordinator) -> None:
    a = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=60, coordinator=coord)
    late = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=60,
                          coordinator=coord)
    assert late.check().allowed  # a slow call goes out while the breaker is CLOSED
    assert a.check().allowed
    a.record_failure()
    assert a.state == BreakerState.OPEN
    late.record_success()  # its success must not close a breaker that opened meanwhile
    assert a.state == BreakerState.OPEN


def test_breakers_with_different_names_are_independent(coord: Coordinator) -> None:
    flaky = CircuitBreaker("anthropic:claude", failure_threshold=1, coordinator=coord)
    fine = CircuitBreaker("openai:gpt-4o", failure_threshold=1, coordinator=coord)
    assert flaky.check().allowed
    flaky.record_failure()
    assert flaky.state == BreakerState.OPEN
    assert fine.check().allowed and fine.state == BreakerState.CLOSED


def test_idle_closed_breaker_leaves_no_key_and_open_one_expires(coord: Coordinator) -> None:
    b = CircuitBreaker(NAME, failure_threshold=2, coordinator=coord)
    assert b.check().allowed
    b.record_failure()
    assert 0 < coord.client.pttl(b.key) <= 24 * 3600 * 1000 + 30_000
    assert b.check().allowed
    b.record_success()
    assert coord.client.exists(b.key) == 0


@pytest.mark.parametrize("kwargs,field", [
    ({"failure_threshold": 0}, "failure_threshold"),
    ({"failure_threshold": 2.5}, "failure_threshold"),
    ({"recovery_timeout_s": 0}, "recovery_timeout_s"),
    ({"recovery_timeout_s": float("nan")}, "recovery_timeout_s"),
    ({"probe_lease_s": 0.01}, "probe_lease_s"),
    ({"probe_lease_s": True}, "probe_lease_s"),
    ({"name": "a{b}"}, "name"),
    ({"name": ""}, "name"),
])
def test_bad_configuration_raises_a_typed_error(coord: Coordinator, kwargs: dict[str, Any],
                                                field: str) -> None:
    args: dict[str, Any] = {"name": NAME, **kwargs}
    with pytest.raises(InvalidConfigError) as err:
        CircuitBreaker(args.pop("name"), coordinator=coord, **args)
    assert err.value.problems[0]["loc"] == (field,)
    assert field in str(err.value)
    assert coord.client.dbsize() == 0


def test_script_cache_flush_is_survived(coord: Coordinator) -> None:
    b = CircuitBreaker(NAME, failure_threshold=1, coordinator=coord)
    assert b.check().allowed
    coord.client.script_flush()
    b.record_failure()
    coord.client.script_flush()
    assert b.state == BreakerState.OPEN


def test_unreachable_redis_fails_closed() -> None:
    server = RedisServer()
    server.start()
    coord = Coordinator.from_url(server.url)
    try:
        b = CircuitBreaker(NAME, coordinator=coord)
        assert b.check().allowed
        server.stop()
        decision = b.check()
        assert not decision.allowed and "Redis unavailable" in decision.reason
        b.record_failure()  # logged, never raised
        with pytest.raises(redis.ConnectionError):
            b.state  # noqa: B018 - reading the state needs Redis and says so
    finally:
        coord.close()
        server.stop()


def test_concurrent_async_calls_get_one_probe_and_its_success_closes_it(
        coord: Coordinator) -> None:
    breaker = CircuitBreaker(NAME, failure_threshold=1, recovery_timeout_s=1.0)
    assert breaker.check().allowed
    breaker.record_failure()
    _wait_for(lambda: breaker.state == BreakerState.HALF_OPEN)

    async def three_calls(ctx: ExecutionContext) -> list[Decision]:
        gate = asyncio.Event()

        async def provider_call() -> str:
            await gate.wait()  # the probe stays in flight while the others are refused
            return "ok"

        tasks = [asyncio.create_task(ctx.awrap_llm_call(provider_call)) for _ in range(3)]
        while sum(t.done() for t in tasks) < 2:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=5)
        gate.set()
        return list(await asyncio.gather(*tasks))

    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=3),
                          circuit_breaker=breaker) as ctx:
        got = asyncio.run(three_calls(ctx))
        assert sorted(got) == [Decision.ALLOW, Decision.HALT, Decision.HALT]
        assert breaker.state == BreakerState.CLOSED
        assert len([e for e in ctx.get_snapshot().events
                    if e.event_type == "circuit_open"]) == 2
