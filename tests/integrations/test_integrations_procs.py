"""The SDK transport across OS processes: eight processes, each an ``OpenAI`` client given
the transport, share one $0.50 root through its token (charged exactly the provider's
usage priced, the ceiling held, refused requests never sent); an abort from another
process cancels a streaming request in flight."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.core import pricing
from coordinator.core.amounts import usd_to_micro
from tests.support import integration_procs
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree

SPAWN = mp.get_context("spawn")


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.mark.slow
def test_eight_processes_share_one_root(coord: Coordinator, redis_url: str,
                                        server: ProviderServer) -> None:
    root = ExecutionContext(ExecutionConfig(max_cost_usd=0.5, max_steps=100_000,
                                            max_retries_total=100))
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=integration_procs.spend_through_openai,
                             args=(redis_url, root.token, server.openai_url, i, out))
               for i in range(8)]
    for w in workers:
        w.start()
    results = [out.get(timeout=240) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    served = server.provider.stats()
    allowed = sum(r["allowed"] for r in results)
    assert allowed > 8 and sum(r["refused"] for r in results) >= 24
    assert {reason for r in results for reason in r["reasons"]} == {"budget_exceeded"}
    # every allowed request reached the provider once; no refused one did
    assert len(served) == allowed
    expected = 0
    for s in served:
        cost = pricing.price_usd(s["model"], s["prompt_tokens"], s["completion_tokens"])
        assert cost is not None
        expected += usd_to_micro(cost)
    used = check_tree(coord.client, root.chain_id)
    assert used == expected <= 500_000
    snap = root.get_snapshot()
    assert usd_to_micro(snap.cost_usd_accumulated) == expected
    assert snap.cost_usd_reserved == 0
    root.close()


@pytest.mark.parametrize("use_async", [False, True], ids=["OpenAI", "AsyncOpenAI"])
def test_abort_from_another_process_cancels_a_stream(coord: Coordinator, redis_url: str,
                                                     server: ProviderServer,
                                                     use_async: bool) -> None:
    with ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                          max_retries_total=3)) as root:
        child = root.spawn_child()
        ready, out = SPAWN.Event(), SPAWN.Queue()
        p = SPAWN.Process(target=integration_procs.stream_until_aborted,
                          args=(redis_url, child.token, server.openai_url, use_async,
                                ready, out))
        p.start()
        assert ready.wait(60)
        sent = time.time()
        root.abort("operator pressed stop")
        res = out.get(timeout=30)
        p.join(30)
        assert res["reason"] == "aborted" and res["decision"] == "HALT"
        assert res["heard"] >= sent
        # the transport's part: from the moment the process heard the abort to the end
        # of the request, and end to end (pub/sub delivery included)
        assert res["ended"] - res["heard"] < 0.1
        assert res["ended"] - sent < 5
        assert res["seen"] < 200  # 1,000 chunks were coming, 20 ms apart
        assert res["status"] == "aborted"
        deadline = time.monotonic() + 5
        while not server.provider.stats()[0]["disconnected"]:  # the provider saw it go
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # charged what its chunks carried (one token each after the role chunk), not the
        # estimate of 1,000 output tokens
        assert res["output_tokens"] == res["seen"] - 1
        child.close()
