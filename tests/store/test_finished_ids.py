"""Finished reservation ids (``bc:{R}:fin``) are bounded in count, yet no finish is ever
charged twice: an id is kept 5 s at least, past that only among the latest 1000, and a
settle that may come later than that (a repeat, or one whose lease lapsed and was reaped)
is flagged late and charges nothing when its id's trace is gone."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.core.contracts import SETTLE
from coordinator.core.keys import KeySpace
from coordinator.core.paths import Path
from coordinator.models_records import node_facts
from coordinator.store.lateness import LATE_AFTER_S, Lateness
from coordinator.store.tree import Held
from coordinator.store.wire import Op
from tests.support.invariants import check_tree, orphans
from tests.support.procs import TEST_KEYS

KS = KeySpace()
CONFIG = ExecutionConfig(max_cost_usd=100.0, max_steps=1_000_000, max_retries_total=100)
CAP, FLOOR_MS = 1000, 5000  # lua/lib/finished_ids.lua FINISHED_CAP, FINISHED_FLOOR_MS


def redis_ms(coord: Coordinator) -> int:
    sec, usec = coord.client.time()
    return int(sec) * 1000 + int(usec) // 1000


def until_trimmed(ctx: ExecutionContext, fin: str, coord: Coordinator, done: object) -> None:
    """Make calls (each settle trims on one Redis ms in 16) until ``done()``: tool calls
    that report nothing, so they cost nothing (an LLM call would be charged the floor)."""
    deadline = time.monotonic() + 10
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the finished ids were never trimmed"
        assert ctx.wrap_tool_call(lambda: None) == Decision.ALLOW
        coord.store.flush()
        time.sleep(0.003)


def test_finished_ids_are_capped_past_the_floor_and_kept_within_it(
        coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        fin = KS.finished(root.root_id)
        now = redis_ms(coord)
        coord.client.zadd(fin, {f"old-{i}": now - 2 * FLOOR_MS for i in range(20_000)})
        coord.client.zadd(fin, {f"gone-{i}": now - 3_700_000 for i in range(10)})
        coord.client.zadd(fin, {f"recent-{i}": now - FLOOR_MS // 5 for i in range(3000)})
        until_trimmed(root, fin, coord, lambda: coord.client.zcard(fin) < 5000)
        kept = coord.client.zrange(fin, 0, -1)
        assert not any(k.startswith("gone-") for k in kept)  # older than an hour
        assert sum(k.startswith("recent-") for k in kept) == 3000  # within the floor
        # past the floor, only the latest (by finish time) up to the cap are left
        assert sum(k.startswith("old-") for k in kept) <= CAP
        assert len(kept) < CAP + 3000 + 100
    check_tree(coord.client, root.root_id)


def test_a_settle_after_its_reaped_id_was_trimmed_is_not_charged_twice(
        coord: Coordinator, redis_url: str) -> None:
    """The reaper charged the estimate of a lease that lapsed; the id's trace was trimmed
    by the cap; the settle of the paused process then lands: it is late (its lease was
    not confirmed for over half a lease), found without trace, and charges nothing."""
    paused = Coordinator.from_url(redis_url, token_keys=TEST_KEYS, lease_ms=400)
    try:
        with ExecutionContext(CONFIG, coordinator=coord) as root:
            path = Path(root.root_id, (root.root_id,))
            # a process that reserves, then stops (no renewal: its threads never ran)
            held = paused.store.reserve(path, "paused-call", ["usd", 50_000])
            assert isinstance(held, Held)
            time.sleep(0.5)
            assert root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.001)) \
                == Decision.ALLOW  # reaps the lapsed lease: charges its estimate
            coord.store.flush()
            fin = KS.finished(root.root_id)
            assert coord.client.zscore(fin, "paused-call") is not None
            charged = root.get_snapshot().cost_usd_accumulated
            assert round(charged, 6) == 0.051
            # the trace ages past the floor, and 1000 ids finish after it: trimmed
            now = redis_ms(coord)
            coord.client.zadd(fin, {"paused-call": now - 3 * FLOOR_MS})
            coord.client.zadd(fin, {f"later-{i}": now - 2 * FLOOR_MS for i in range(CAP)})
            until_trimmed(root, fin, coord,
                          lambda: coord.client.zscore(fin, "paused-call") is None)
            # the paused process wakes up and settles what its call spent
            stops = paused.store.finish(path, "paused-call", outcome="ok", node=None,
                                        amounts=["usd", 30_000], write_behind=False)
            assert stops == []
            # the estimate, once (the calls that trimmed cost nothing)
            assert root.get_snapshot().cost_usd_accumulated == charged
            assert orphans(coord.client, root.root_id) == (0, 0)
            assert any("SettleLate" in fields["e"] for _, fields in
                       coord.client.xrange(KS.ledger(root.root_id)))
        check_tree(coord.client, root.root_id)
    finally:
        paused.close()


def _settle_args(reservation_id: str, amounts: tuple[str | int, ...]) -> list[Any]:
    return SETTLE.arg_list(reservation_id=reservation_id, abort_channel="ch", node="",
                           node_cap=10, ledger_channel="lch", late=False, amounts=amounts,
                           **node_facts(None))


def test_a_finish_is_late_when_first_sent_long_ago_or_its_lease_unconfirmed() -> None:
    lateness = Lateness(lease_ms=4000)
    late = SETTLE.slot("late")
    op = Op("settle", [], _settle_args("r1", ("usd", 5)), reservation_id="r1", late_at=late)
    lateness.confirm(["r1"])
    assert lateness.args(op)[late] == "0"  # first send, lease just confirmed
    op.first_sent -= LATE_AFTER_S + 0.1
    assert lateness.args(op)[late] == "1"  # a repeat long after its first send
    fresh = Op("settle", [], _settle_args("r2", ()), reservation_id="r2", late_at=late)
    lateness.confirm(["r2"])
    lateness._confirmed["r2"] -= 2.1  # more than half a lease without renewal
    assert lateness.args(fresh)[late] == "1"
    assert op.args[late] == "0"  # the op itself is not changed
