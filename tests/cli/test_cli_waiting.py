"""``budgetctl top`` and ``tree`` show a tree waiting for approval (the root hash's
approval_ctx, approval_reason and approval_until_ms, later than Redis now), in the state
column and as ``waiting_for_approval`` in ``--json``; a wait that has ended shows no more;
and a real call waiting in another thread shows until a raise lets it go on."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from tests.support.cli import budgetctl

Capture = pytest.CaptureFixture[str]


def test_top_and_tree_show_the_wait(coord: Coordinator, redis_url: str,
                                    capsys: Capture) -> None:
    config = ExecutionConfig(max_cost_usd=0.05, max_steps=20, max_retries_total=3)
    run = ExecutionContext(config, metadata=ChainMetadata(request_id=uuid.uuid4().hex,
                                                          chain_id="waits"))
    kid = run.spawn_child(max_cost_usd=0.01)
    other = ExecutionContext(config, metadata=ChainMetadata(request_id=uuid.uuid4().hex,
                                                            chain_id="does-not-wait"))
    coord.store.flush()
    key = coord.keyspace.ctx("waits", "waits")
    until = int(coord.redis_now_ms()) + 300_000
    coord.client.hset(key, mapping={"approval_ctx": kid.chain_id,
                                    "approval_reason": "budget_exceeded",
                                    "approval_until_ms": until})

    code, out, _ = budgetctl(capsys, redis_url, "top", "--json")
    trees = {t["id"]: t for t in json.loads(out)["trees"]}
    assert code == 0
    assert trees["waits"]["waiting_for_approval"] == {
        "ctx": kid.chain_id, "reason": "budget_exceeded", "until_ms": until}
    assert trees["does-not-wait"]["waiting_for_approval"] is None

    code, out, _ = budgetctl(capsys, redis_url, "top")
    line = next(ln for ln in out.splitlines() if ln.startswith("waits "))
    assert f"waiting for approval: budget_exceeded at {kid.chain_id} (4m5" in line, line
    assert "waiting" not in next(ln for ln in out.splitlines() if ln.startswith("does-not"))

    code, out, _ = budgetctl(capsys, redis_url, "tree", "waits", "--json")
    doc = json.loads(out)
    assert doc["tree"]["waiting_for_approval"]["reason"] == "budget_exceeded"
    code, out, _ = budgetctl(capsys, redis_url, "tree", "waits")
    assert "waiting for approval: budget_exceeded at" in out.splitlines()[0]

    # a wait whose end has passed (its process died) shows no more
    coord.client.hset(key, "approval_until_ms", int(coord.redis_now_ms()) - 1)
    code, out, _ = budgetctl(capsys, redis_url, "top", "--json")
    trees = {t["id"]: t for t in json.loads(out)["trees"]}
    assert trees["waits"]["waiting_for_approval"] is None
    for ctx in (kid, run, other):
        ctx.close()


def test_top_json_shows_a_real_wait_until_a_raise(coord: Coordinator, redis_url: str,
                                                  capsys: Capture) -> None:
    """A call waiting for approval in another thread (approval_wait_s): `top --json` shows
    its tree waiting; a raise lets the call go on, and the tree waits no more."""
    config = ExecutionConfig(max_cost_usd=0.05, max_steps=20, max_retries_total=3,
                             approval_wait_s=30)
    run = ExecutionContext(config, metadata=ChainMetadata(request_id=uuid.uuid4().hex,
                                                          chain_id="real-wait"))
    cent = WrapOptions(cost_estimate_hint=0.05)
    assert run.wrap_llm_call(lambda: report_usage(cost_usd=0.05), cent) == Decision.ALLOW
    got: list[Decision] = []
    caller = threading.Thread(target=lambda: got.append(run.wrap_llm_call(
        lambda: report_usage(cost_usd=0.01), WrapOptions(cost_estimate_hint=0.01))))
    caller.start()

    def waiting() -> dict[str, object] | None:
        out = budgetctl(capsys, redis_url, "top", "--json")[1]
        tree = {t["id"]: t for t in json.loads(out)["trees"]}["real-wait"]
        wait: dict[str, object] | None = tree["waiting_for_approval"]
        return wait

    deadline = time.monotonic() + 10
    while (wait := waiting()) is None:
        assert time.monotonic() < deadline, "top --json never showed the wait"
        time.sleep(0.1)
    assert wait["ctx"] == "real-wait" and wait["reason"] == "budget_exceeded"
    coord.set_limits("real-wait", max_cost_usd=0.10, actor="olga", reason="approved")
    caller.join(10)
    assert got == [Decision.ALLOW]
    assert waiting() is None
    run.close()
