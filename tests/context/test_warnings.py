"""Budget warnings (ExecutionConfig.warn_at, issue 31): a level whose spend or steps
reaches a threshold records one budget_warning event, however many processes race across
it, and every handle under the level hears it once, in this process and in others;
ctx.limits() tells the fraction left of the tightest USD ceiling."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
from typing import Any

import pytest
import redis

from coordinator import (
    BudgetWarning,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    LeasePolicy,
    SafetyEvent,
    WrapOptions,
    report_usage,
)
from tests.support import lease_procs, warning_procs
from tests.support.invariants import check_tree
from tests.support.waiting import until

SPAWN = mp.get_context("spawn")


def _root(usd: float = 0.10, steps: int = 100, warn_at: tuple[float, ...] = (0.5, 0.8),
          lease: LeasePolicy | None = None) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=steps,
                                            max_retries_total=3, warn_at=warn_at,
                                            lease=lease))


def _listening(coord: Coordinator, **config: Any
               ) -> tuple[ExecutionContext, list[BudgetWarning]]:
    """A root (the test's first handle) with a callback, once this process's stop
    listener is subscribed (a warning published before that is not heard here)."""
    before = _listeners(coord)
    root = _root(**config)
    heard: list[BudgetWarning] = []
    root.on_warning(heard.append)
    until(lambda: _listeners(coord) > before, "this process's listener subscribed")
    return root, heard


def _left_at_most(heard: list[BudgetWarning], at_crossing: list[tuple[float, int]]) -> bool:
    """Whether each warning heard says no more was left than at its crossing."""
    return len(heard) == len(at_crossing) and all(
        w.remaining_usd is not None and w.remaining_steps is not None
        and w.remaining_usd <= usd + 1e-9 and w.remaining_steps <= steps
        for w, (usd, steps) in zip(heard, at_crossing, strict=True))


def _spend(ctx: ExecutionContext, calls: int, usd: float = 0.01) -> list[Decision]:
    options = WrapOptions(cost_estimate_hint=usd)
    return [ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd), options)
            for _ in range(calls)]


def _warnings(ctx: ExecutionContext) -> list[SafetyEvent]:
    return [e for e in ctx.get_snapshot().events if e.event_type == "budget_warning"]


def _listeners(coord: Coordinator) -> int:
    """Connections subscribed to the tenant's abort channel (one per process's listener)."""
    [(_, n)] = coord.client.pubsub_numsub(coord.keyspace.abort_channel)
    return int(n)


def _drain(out: Any, into: list[Any]) -> list[Any]:
    while True:
        try:
            into.append(out.get_nowait())
        except queue.Empty:
            return into


def _books(coord: Coordinator, root: ExecutionContext) -> None:
    """The tree's books checked (tests/support/invariants.py)."""
    assert isinstance(coord.client, redis.Redis)
    check_tree(coord.client, root.root_id, coord.keyspace)


def _heard(warnings: list[BudgetWarning]) -> list[tuple[str, float]]:
    return [(w.dimension, w.threshold) for w in warnings]


def test_two_thresholds_two_events_heard_once_here_and_in_another_process(
        coord: Coordinator, redis_url: str) -> None:
    root, heard = _listening(coord)
    before = _listeners(coord)
    ready, done, out = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    proc = SPAWN.Process(target=warning_procs.hear_warnings,
                         args=(redis_url, root.token, ready, done, out))
    proc.start()
    other: list[dict[str, Any]] = []
    try:
        assert ready.wait(60)
        until(lambda: _listeners(coord) > before, "the other process's listener subscribed")
        assert _spend(root, 10) == [Decision.ALLOW] * 10
        until(lambda: len(heard) >= 2, "this process heard both thresholds")
        until(lambda: len(_drain(out, other)) >= 2, "the other process heard both thresholds")
        later: list[BudgetWarning] = []
        root.on_warning(later.append)  # a second callback: what was recorded, at once
        assert _spend(root, 1) == [Decision.HALT]  # the ceiling: no warning is left
    finally:
        done.set()
        proc.join(30)
    assert _heard(heard) == [("usd", 0.5), ("usd", 0.8)]
    assert [w.chain_id for w in heard] == [root.chain_id] * 2
    # what was left when each was heard: at the crossing (its message), or later when
    # the listener read it back (it subscribed after the crossing): never more
    assert _left_at_most(heard, [(0.05, 95), (0.02, 92)])
    there = [BudgetWarning(**w) for w in _drain(out, other)]
    assert _heard(there) == _heard(heard) and _left_at_most(there, [(0.05, 95), (0.02, 92)])
    assert _heard(later) == _heard(heard)
    events = _warnings(root)
    assert [(e.metadata["threshold"], e.metadata["dimension"]) for e in events] == [
        (0.5, "usd"), (0.8, "usd")]
    assert events[0].decision == Decision.ALLOW
    assert events[0].reason == "spend reached 50% of max_cost_usd ($0.05 of $0.10)"
    assert events[1].metadata == {"chain_id": root.chain_id, "threshold": 0.8,
                                  "dimension": "usd", "remaining": {"usd": 0.02, "steps": 92}}
    root.close()
    _books(coord, root)


def test_processes_racing_across_thresholds_record_one_event_each(
        coord: Coordinator, redis_url: str) -> None:
    thresholds = (0.1, 0.3, 0.5, 0.7)
    # steps far off: spend alone crosses the thresholds
    root, heard = _listening(coord, usd=1.0, steps=1000, warn_at=thresholds)
    go, out = SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=warning_procs.spend_in_a_child,
                           args=(redis_url, root.token, 20, 0.01, go, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    decisions = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(d == ["ALLOW"] * 20 for d in decisions)
    assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.80)
    events = _warnings(root)
    assert sorted(e.metadata["threshold"] for e in events) == list(thresholds)
    until(lambda: len(heard) == 4, "this process heard every threshold")
    assert sorted(w.threshold for w in heard) == list(thresholds)
    root.close()
    _books(coord, root)


def test_a_steps_threshold_warns_with_the_steps_left(coord: Coordinator) -> None:
    root, heard = _listening(coord, usd=1.0, steps=10, warn_at=(0.5,))
    _spend(root, 6, usd=0.001)
    [event] = _warnings(root)
    assert event.reason == "steps reached 50% of max_steps (5 of 10)"
    assert event.metadata["remaining"] == {"usd": 0.995, "steps": 5}
    until(lambda: heard, "the steps warning was heard")
    assert [(w.dimension, w.threshold) for w in heard] == [("steps", 0.5)]
    assert heard[0].remaining_steps in (5, 4)  # at the crossing, or read back after call 6
    root.close()


def test_a_child_handle_hears_its_roots_warning(coord: Coordinator) -> None:
    root, _ = _listening(coord)
    child = root.spawn_child(max_cost_usd=0.08)
    grandchild = child.spawn_child()
    at_child: list[BudgetWarning] = []
    at_grandchild: list[BudgetWarning] = []
    child.on_warning(at_child.append)
    grandchild.on_warning(at_grandchild.append)
    assert _spend(grandchild, 6) == [Decision.ALLOW] * 6
    until(lambda: at_child and at_grandchild, "both handles heard the root's warning")
    assert [(w.chain_id, w.threshold) for w in at_child] == [(root.chain_id, 0.5)]
    assert at_grandchild == at_child
    assert _warnings(child) == [] and len(_warnings(root)) == 1  # the root's own threshold
    assert "w:usd" not in coord.store.read_hash(root.root_id, child.chain_id)  # no warn_at
    grandchild.close()
    child.close()
    root.close()


def test_a_handle_registering_after_the_crossings_hears_them_at_once(
        coord: Coordinator) -> None:
    root = _root()
    assert _spend(root, 9) == [Decision.ALLOW] * 9
    child = root.spawn_child()
    heard: list[BudgetWarning] = []
    child.on_warning(heard.append)  # read back: what remains now
    assert [(w.chain_id, w.threshold, round(w.remaining_usd or 0, 6)) for w in heard] == [
        (root.chain_id, 0.5, 0.01), (root.chain_id, 0.8, 0.01)]
    with pytest.raises(TypeError):
        child.on_warning("not a callable")  # type: ignore[arg-type]
    child.close()
    root.close()


def test_one_charge_across_both_thresholds_records_both(coord: Coordinator) -> None:
    root, heard = _listening(coord)
    assert _spend(root, 1, usd=0.09) == [Decision.ALLOW]
    assert [e.metadata["threshold"] for e in _warnings(root)] == [0.5, 0.8]
    until(lambda: len(heard) == 2, "both warnings heard")
    root.close()


def test_a_threshold_reached_again_after_a_raise_is_not_warned_twice(
        coord: Coordinator) -> None:
    root = _root(warn_at=(0.5,))
    assert _spend(root, 6) == [Decision.ALLOW] * 6
    coord.set_limits(root.chain_id, max_cost_usd=0.20, actor="ops")  # $0.06: 30 % now
    assert _spend(root, 5) == [Decision.ALLOW] * 5  # $0.11: across 50 % of $0.20
    [event] = _warnings(root)
    assert event.reason == "spend reached 50% of max_cost_usd ($0.05 of $0.10)"
    root.close()


def test_a_propagated_cost_warns_like_a_call(coord: Coordinator) -> None:
    root = _root()
    root.propagate_child_cost(0.06)
    [event] = _warnings(root)
    assert event.metadata["threshold"] == 0.5
    root.close()


def test_in_lease_mode_the_warning_comes_with_the_flush(coord: Coordinator) -> None:
    root, heard = _listening(coord, lease=LeasePolicy(usd=0.02, steps=10))
    assert _spend(root, 6) == [Decision.ALLOW] * 6
    root.limits()  # flushes what the slice served
    [event] = _warnings(root)
    assert event.metadata["threshold"] == 0.5
    until(lambda: heard, "the warning was heard")
    assert _heard(heard) == [("usd", 0.5)]
    root.close()
    _books(coord, root)


def test_a_dead_processs_slice_reclaimed_as_used_warns(coord: Coordinator,
                                                        redis_url: str) -> None:
    """A process served five $0.01 calls from a slice of a $0.40 root ($0.10: a quarter
    of what remained) and was SIGKILLed before any flush: the reclaim (lease_return.lua)
    charges the slice as used, past the 20 % threshold."""
    root, heard = _listening(coord, usd=0.40, warn_at=(0.2,),
                             lease=LeasePolicy(usd=0.2, steps=50))
    ready = SPAWN.Queue()
    proc = SPAWN.Process(target=lease_procs.hold_slice,
                         args=(redis_url, root.token, 1000, ready, False))
    proc.start()
    ready.get(timeout=60)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    leases = coord.keyspace.leases(root.root_id)
    until(lambda: coord.client.zrangebyscore(leases, "-inf", coord.store.server_time_ms()),
          "the dead process's lease expired")
    strict = root.spawn_child(lease=False)
    assert _spend(strict, 1) == [Decision.ALLOW]  # its reserve reclaims the slice
    [event] = _warnings(root)
    assert event.reason == "spend reached 20% of max_cost_usd ($0.10 of $0.40)"
    until(lambda: heard, "the warning was heard")
    assert [(w.threshold, round(w.remaining_usd or 0, 6)) for w in heard] == [(0.2, 0.3)]
    strict.close()
    root.close()


def test_limits_tell_the_fraction_left_of_the_tightest_usd_ceiling(
        coord: Coordinator) -> None:
    root = _root(usd=0.10)
    child = root.spawn_child(max_cost_usd=0.04)
    _spend(child, 1)
    assert child.limits().cost_fraction_remaining == pytest.approx(0.75)  # $0.03 of $0.04
    assert root.limits().cost_fraction_remaining == pytest.approx(0.90)
    child.close()
    root.close()
