"""``budgetctl gc``: trees left open by a process that died are listed on a dry run, then
closed and set to expire; a live tree (a call in flight) is left alone."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, report_usage
from coordinator.cli import main

Capture = pytest.CaptureFixture[str]
CFG = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=1)


def _cli(capsys: Capture, redis_url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--redis", redis_url, *args])
    out, err = capsys.readouterr()
    return code, out, err


@contextmanager
def _in_call(ctx: ExecutionContext) -> Iterator[None]:
    """``ctx`` has a call in flight (its lease held) for the duration: a live process,
    however long the test takes on a busy machine."""
    entered, done = threading.Event(), threading.Event()

    def call() -> None:
        entered.set()
        done.wait(60)

    worker = threading.Thread(target=ctx.wrap_llm_call, args=(call,))
    worker.start()
    try:
        assert entered.wait(60)
        yield
    finally:
        done.set()
        worker.join()


def test_gc_lists_then_closes_and_expires_an_idle_tree(coord: Coordinator, redis_url: str,
                                                       capsys: Capture) -> None:
    dead = ExecutionContext(CFG, coordinator=coord)  # never closed: its process "died"
    dead.wrap_llm_call(lambda: report_usage(cost_usd=0.25))
    child = dead.spawn_child(max_cost_usd=0.5)
    coord.store.flush()
    time.sleep(1.2)
    live = ExecutionContext(CFG, coordinator=coord)
    with _in_call(live):
        code, out, _ = _cli(capsys, redis_url, "gc", "--idle", "1", "--dry-run", "--json")
        assert code == 0
        listed = json.loads(out)
        assert listed["dry_run"] is True and listed["expired"] == 0
        assert [t["id"] for t in listed["idle"]] == [dead.chain_id]
        assert listed["idle"][0]["contexts"] == 2 and listed["idle"][0]["spent_usd"] == 0.25
        assert coord.client.hget(coord.keyspace.ctx(dead.chain_id, dead.chain_id),
                                 "status") == "running"  # the dry run changed nothing

        code, out, _ = _cli(capsys, redis_url, "gc", "--idle", "1")
        assert code == 0
        assert dead.chain_id in out and "closed and set to expire: 1" in out
        ks = coord.keyspace
        assert coord.client.hget(ks.ctx(dead.chain_id, dead.chain_id), "status") == "closed"
        # every key of the tree expires, the child that was never closed included
        assert 0 < coord.client.ttl(ks.ctx(dead.chain_id, child.chain_id))
        assert coord.views.active_roots() == [live.chain_id]

        code, out, _ = _cli(capsys, redis_url, "gc", "--idle", "1", "--json")
        assert code == 0 and json.loads(out)["idle"] == []
    live.close()


def test_gc_rejects_a_negative_idle_time(redis_url: str, capsys: Capture) -> None:
    code, _, err = _cli(capsys, redis_url, "gc", "--idle", "-5")
    assert code == 2 and "--idle" in err
