"""A call is not refused by this process's own settles still on their way: a settle
within the estimate is written behind, and the flusher may send it on its connection
after the next reserve went out on the caller's. The refusal that reserve gets (the
settled call still held) is asked once more after those settles landed, so the level
that reached its limit stops for good, with its reason."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.store.wire import Wire
from tests.support.invariants import check_tree


def test_the_refusal_at_the_limit_waits_for_the_settle_the_flusher_holds(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=1, max_retries_total=1))
    main = threading.main_thread()
    gate = threading.Event()
    send = Wire._send_conn

    def background_waits(self: Wire, conn: Any, ops: Any) -> Any:
        # every background thread (the flusher) sends only once the gate opens
        if threading.current_thread() is not main:
            gate.wait(10)
        return send(self, conn, ops)

    monkeypatch.setattr(Wire, "_send_conn", background_waits)
    wire = coord.store.wire
    mark = wire.write_mark()
    opts = WrapOptions(cost_estimate_hint=0.01)
    assert root.wrap_tool_call(lambda: "ran", opts) == Decision.ALLOW
    # the settle (within the estimate: written behind) is taken by the flusher, held
    for _ in range(200):
        if wire.wrote_since(mark):
            break
        gate.wait(0.01)
    assert wire.wrote_since(mark), "the flusher never took the settle"
    threading.Timer(0.2, gate.set).start()

    # the reserve goes out before that settle lands: the step it held still counts as held
    assert root.wrap_tool_call(lambda: "never runs", opts) == Decision.HALT
    assert root.stop_reason == "step_limit_exceeded"
    assert root.get_snapshot().step_count == 1
    root.close()
    check_tree(coord.client, root.chain_id)
