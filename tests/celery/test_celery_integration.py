"""The Celery integration against real worker subprocesses (prefork pool, two workers),
on a Redis broker the tests start, and on RabbitMQ at 127.0.0.1:5672 when it answers."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.exceptions import TaskRevokedError
from kombu import Connection

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.celery import NoContextHeaderError, TaskStoppedError, install
from coordinator.context.cancellation import CancellationToken
from coordinator.core.amounts import usd_to_micro
from coordinator.core.charging_rules import DEFAULT_FLOOR_USD
from coordinator.embedded import RedisServer
from coordinator.errors import TokenMalformedError, TokenSignatureError
from tests.support.celery_app_harness import TOKEN_KEYS, Workers
from tests.support.waiting import until

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672//"
APP = "tests.support.celery_app"
T = "tests.support.celery_app."


@dataclass
class Cluster:
    """Workers on one broker, a client app to send tasks, and the Redis they share."""

    app: Celery
    coord: Coordinator
    marks: redis.Redis
    budget: redis.Redis
    workers: Workers

    def sig(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.app.signature(T + name, args=args, kwargs=kwargs)

    def root(self, cost: float = 10.0, steps: int = 1000, retries: int = 10,
             **kw: Any) -> ExecutionContext:
        return ExecutionContext(ExecutionConfig(max_cost_usd=cost, max_steps=steps,
                                                max_retries_total=retries, **kw),
                                coordinator=self.coord)

    def ledger(self, root: ExecutionContext) -> dict[str, Any]:
        """Committed and held spend at the root, and the open reservations of the tree."""
        h = self.budget.hgetall(f"bc:{{{root.root_id}}}:ctx:{root.root_id}")
        return {"used": int(h.get("u:usd") or 0), "held": int(h.get("h:usd") or 0),
                "steps": int(h.get("u:steps") or 0),
                "open": self.budget.hlen(f"bc:{{{root.root_id}}}:res")}


@pytest.fixture(scope="module")
def test_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _rabbit_or_skip() -> None:
    try:
        with Connection(RABBIT_URL, connect_timeout=1) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available here"
        pytest.skip(f"RabbitMQ does not answer at {RABBIT_URL} ({exc}); start one to run "
                    f"the AMQP variant")


@pytest.fixture(scope="module")
def env_for(test_redis: RedisServer) -> Any:
    base = f"redis://127.0.0.1:{test_redis.port}"

    def make(broker: str) -> dict[str, str]:
        return {
            "BC_BROKER_URL": base + "/1" if broker == "redis" else RABBIT_URL,
            "BC_BACKEND_URL": base + "/2",
            "BC_MARK_URL": base + "/3",
            "BC_QUEUE": f"bc-test-{uuid.uuid4().hex[:10]}",
            "BUDGET_REDIS_URL": base + "/0",
            "BUDGET_TOKEN_KEYS": TOKEN_KEYS,
            "BUDGET_LEASE_MS": "1000",
            "PYTHONWARNINGS": "ignore",  # Celery's warning about running as root
        }

    return make


def _cluster(env: dict[str, str], concurrency: int, pool: str = "prefork"
             ) -> Iterator[Cluster]:
    install()
    app = Celery("bc_client", broker=env["BC_BROKER_URL"], backend=env["BC_BACKEND_URL"])
    app.conf.update(task_default_queue=env["BC_QUEUE"], result_expires=600,
                    broker_connection_retry_on_startup=True)
    kid, _, secret = TOKEN_KEYS.partition(":")
    coord = Coordinator.from_url(env["BUDGET_REDIS_URL"], token_keys={kid: secret.encode()},
                                 lease_ms=1000)
    workers = Workers(app, APP, env, count=2, pool=pool, concurrency=concurrency)
    workers.start()
    marks = redis.Redis.from_url(env["BC_MARK_URL"], decode_responses=True)
    try:
        yield Cluster(app, coord, marks, coord.client, workers)
    finally:
        workers.stop()
        if env["BC_BROKER_URL"].startswith("amqp"):
            with Connection(RABBIT_URL) as conn:
                conn.default_channel.queue_delete(env["BC_QUEUE"])
        coord.close()
        app.close()


@pytest.fixture(scope="module", params=["redis", "amqp"])
def cluster(request: pytest.FixtureRequest, env_for: Any) -> Iterator[Cluster]:
    """Two prefork workers (concurrency 2) on a Redis broker, then on RabbitMQ."""
    if request.param == "amqp":
        _rabbit_or_skip()
    yield from _cluster(env_for(request.param), concurrency=2)


@pytest.fixture(scope="module")
def redis_cluster(env_for: Any) -> Iterator[Cluster]:
    """Two prefork workers (concurrency 2) on a Redis broker."""
    yield from _cluster(env_for("redis"), concurrency=2)


@pytest.fixture(scope="module", params=["redis", "amqp"])
def wide_cluster(request: pytest.FixtureRequest, env_for: Any) -> Iterator[Cluster]:
    """Two prefork workers with 10 processes each: 20 tasks run at once."""
    if request.param == "amqp":
        _rabbit_or_skip()
    yield from _cluster(env_for(request.param), concurrency=10)


@pytest.fixture(scope="module")
def threads_cluster(env_for: Any) -> Iterator[Cluster]:
    """Two workers on the threads pool (3 threads each) on a Redis broker."""
    yield from _cluster(env_for("redis"), concurrency=3, pool="threads")


@pytest.fixture(autouse=True)
def _clean_marks(request: pytest.FixtureRequest) -> None:
    for name in ("cluster", "redis_cluster", "wide_cluster", "threads_cluster"):
        if name in request.fixturenames:
            request.getfixturevalue(name).marks.flushdb()


def _outcomes(results: list[Any]) -> list[Any]:
    """Each result's value, or its exception."""
    out: list[Any] = []
    for r in results:
        try:
            out.append(r.get(timeout=60))
        except Exception as exc:  # noqa: BLE001 - collected for the assertions
            out.append(exc)
    return out


def test_fan_out_of_20_agents_holds_the_parent_ceiling_exactly(cluster: Cluster) -> None:
    with cluster.root(cost=1.00) as root:
        res = group(cluster.sig("llm_agent", 10, 0.02, 2) for _ in range(20)).apply_async()
        outcomes = _outcomes(res.results)
    calls = sum(o["calls"] for o in outcomes if isinstance(o, dict))
    stopped = [o for o in outcomes if isinstance(o, Exception)]
    assert all(isinstance(e, TaskStoppedError) and e.reason == "budget_exceeded"
               for e in stopped), stopped
    assert len(cluster.marks.smembers("calling_pids")) >= 2  # several processes spent
    ledger = cluster.ledger(root)
    # 20 agents wanted $4.00; estimates equal actuals, so the $1.00 ceiling is met exactly
    assert ledger == {"used": 1_000_000, "held": 0, "steps": 50, "open": 0}
    assert calls == 50
    snap = root.get_snapshot()
    assert snap.abort_reason == "budget_exceeded"
    # every task joined the tree, those refused before their body ran included
    assert len(cluster.coord.store.children(root.root_id, root.chain_id)) == 20


def test_chain_group_and_chord_carry_the_token(cluster: Cluster) -> None:
    with cluster.root() as root:
        chained = chain(cluster.sig("probe"), cluster.sig("probe"), cluster.sig("probe"))
        c = chained.apply_async().get(timeout=30)
        g = group(cluster.sig("probe") for _ in range(4)).apply_async().get(timeout=30)
        ch = chord(group(cluster.sig("probe") for _ in range(3)),
                   cluster.sig("collect")).apply_async().get(timeout=30)
        plain = cluster.sig("plain_probe").apply_async().get(timeout=30)
        inner = cluster.sig("fan_out", 2).apply_async().get(timeout=30)
    r = root.chain_id
    # the last link of a chain reports itself; every link joined the same tree
    assert c["path"] == [r, c["task_id"]]
    assert sorted(cluster.marks.lrange("runs", 0, -1)).count(c["task_id"]) == 1
    assert all(x["path"] == [r, x["task_id"]] for x in g)
    assert ch["path"][0] == r and len(ch["path"]) == 2
    assert all(x["path"] == [r, x["task_id"]] for x in ch["results"])
    assert plain and ExecutionContext.attach(plain, cluster.coord).chain_id == r
    # tasks sent from inside a contained task are its children
    assert all(len(x["path"]) == 3 and x["path"][0] == r for x in inner)
    assert len({x["path"][1] for x in inner}) == 1
    assert len(cluster.coord.store.children(r, r)) == 3 + 4 + 4 + 1


def test_a_root_made_on_a_running_event_loop_is_joined_by_its_task(
        redis_cluster: Cluster) -> None:
    """A root made while an event loop runs on the thread (a notebook) is opened before
    the task's header names it: the task joins it instead of failing (issue 25, case 6)."""
    async def notebook_cell() -> tuple[ExecutionContext, dict[str, Any]]:
        with redis_cluster.root() as root:
            res = redis_cluster.sig("probe").apply_async()
            out = await asyncio.to_thread(res.get, timeout=30)
        return root, out

    root, out = asyncio.run(notebook_cell())
    assert out["path"] == [root.chain_id, out["task_id"]]
    assert redis_cluster.coord.store.children(root.chain_id, root.chain_id) == [
        out["task_id"]]


def test_a_task_without_a_token_opens_a_root_named_after_it(redis_cluster: Cluster) -> None:
    out = redis_cluster.sig("solo").apply_async().get(timeout=30)
    assert out["path"] == [out["task_id"]]
    deadline = time.monotonic() + 10
    while True:  # the close lands just after the result (off the task's critical path)
        snap = ExecutionContext.load_snapshot(out["task_id"], redis_cluster.coord)
        if snap.status == "closed" or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert snap.metadata is not None
    assert snap.metadata.service == T + "solo"
    assert snap.metadata.request_id == out["task_id"]
    assert snap.metadata.tags["celery_host"] in redis_cluster.workers.names
    assert snap.status == "closed"
    assert snap.max_cost_usd == pytest.approx(0.10)


def test_a_task_sent_outside_any_context_says_no_header_arrived(redis_cluster: Cluster
                                                              ) -> None:
    """A task whose @contained names some limits (a child's), sent with no context current:
    its error says no ``budget_context`` header arrived and how to fix it, not that an
    ExecutionConfig is invalid; nothing is recorded."""
    res = redis_cluster.sig("llm_agent", 1, 0.01).apply_async()
    with pytest.raises(NoContextHeaderError) as info:
        res.get(timeout=30)
    err = info.value
    assert (err.task_name, err.task_id) == (T + "llm_agent", res.id)
    assert err.missing == ("max_steps", "max_retries_total")
    assert str(err) == (
        f"task {T}llm_agent[{res.id}] received no budget_context header, so it has no "
        f"context to join: send it from inside one (`with ExecutionContext(...):` around "
        f"`.delay()`, with install(app) called in the sending process), or give @contained "
        f"max_steps and max_retries_total so that it opens a root of its own")
    assert not redis_cluster.budget.keys(f"bc:where:{res.id}*")


def test_a_bad_token_fails_the_task_and_records_nothing(redis_cluster: Cluster) -> None:
    res = redis_cluster.sig("probe").apply_async(headers={"budget_context": "garbage"})
    with pytest.raises(TokenMalformedError):
        res.get(timeout=30)
    assert redis_cluster.marks.llen("runs") == 0
    assert not redis_cluster.budget.keys(f"bc:where:{res.id}*")
    # a tampered token: the TokenError the result backend hands back says it once
    with redis_cluster.root() as root:
        payload, sig = root.token.split(".")
        forged = payload + "." + ("A" if sig[0] != "A" else "B") + sig[1:]
    res = redis_cluster.sig("probe").apply_async(headers={"budget_context": forged})
    with pytest.raises(TokenSignatureError) as info:
        res.get(timeout=30)
    assert str(info.value) == "context token rejected: signature mismatch"
    assert redis_cluster.marks.llen("runs") == 0


def test_a_task_queued_behind_a_stopped_context_never_runs(redis_cluster: Cluster) -> None:
    with redis_cluster.root() as root:
        root.abort("operator said stop")
        res = redis_cluster.sig("probe").apply_async()
        with pytest.raises(TaskStoppedError) as err:
            res.get(timeout=30)
    assert err.value.reason == "aborted"
    assert redis_cluster.marks.llen("runs") == 0


def test_a_message_past_the_context_deadline_is_dropped_by_celery(
        redis_cluster: Cluster) -> None:
    with redis_cluster.root(timeout_ms=1500) as root:
        assert root.deadline is not None
        res = redis_cluster.sig("probe").apply_async(countdown=3)  # due after the deadline
        with pytest.raises(TaskRevokedError):
            res.get(timeout=30)
    assert res.state == "REVOKED"
    assert redis_cluster.marks.llen("runs") == 0


def test_a_retry_consumes_the_chain_retry_budget(redis_cluster: Cluster) -> None:
    with redis_cluster.root(retries=3) as root:
        res = redis_cluster.sig("flaky").apply_async()
        with pytest.raises(TaskStoppedError) as err:
            res.get(timeout=60)
        snap = root.get_snapshot()
    assert err.value.reason == "retry_budget_exceeded"
    assert redis_cluster.marks.llen("runs") == 3  # the 4th attempt never ran
    assert snap.retries_used == 3
    assert snap.abort_reason == "retry_budget_exceeded"


@pytest.mark.slow
# twice in two clean-clone runs of 2026-11-28 (suite at load 5, 23 worker processes on 2
# cores) a reservation was missing or left over in this tree's ledger; alone it passes:
# the cause is not found yet (closing note of that day), so one rerun is allowed
@pytest.mark.flaky(reruns=1)
def test_abort_ends_20_running_tasks_within_a_second(wide_cluster: Cluster) -> None:
    cl = wide_cluster
    modes = ["sleep"] * 7 + ["loop"] * 7 + ["llm"] * 6
    with cl.root(cost=10.0) as root:
        results = [cl.sig("busy", m, 0.25).apply_async() for m in modes]
        deadline = time.monotonic() + 60
        while cl.marks.llen("started") < len(modes):
            assert time.monotonic() < deadline, (
                f"the 20 tasks did not all start: {cl.marks.lrange('started', 0, -1)}")
            time.sleep(0.05)
        # the llm ones are inside their wrapped call once the six reservations are held
        until(lambda: cl.ledger(root)["open"] == 6, "the six llm calls reserved")
        t0 = time.time()
        root.abort("stop everything")
        outcomes = _outcomes(results)
    ended = [float(x) for x in cl.marks.lrange("ended", 0, -1)]
    assert len(ended) == 20
    assert max(ended) - t0 < 1.0, f"last task ended {max(ended) - t0:.3f} s after abort"
    assert all(isinstance(o, TaskStoppedError) and o.reason == "aborted" for o in outcomes)
    pids = {s.split(":")[1] for s in cl.marks.lrange("started", 0, -1)}
    assert len(pids) == 20
    # each interrupted call settles once, at its estimate (it may have been billed); a
    # worker whose flush before the result timed out on a loaded machine sends it at
    # the context's close, just after the result (decorator.py)
    ledger = until(lambda: (lg := cl.ledger(root))["open"] == 0 and lg["held"] == 0 and lg,
                   "the interrupted calls settled", timeout_s=15)
    assert ledger["used"] == 6 * 250_000


def test_abort_stops_polling_looping_and_awaiting_tasks_on_the_threads_pool(
        threads_cluster: Cluster) -> None:
    cl = threads_cluster
    with cl.root(cost=10.0) as root:
        results = [cl.sig("busy", "poll"), cl.sig("busy", "poll"), cl.sig("busy", "loop"),
                   cl.sig("busy", "loop"), cl.sig("awaiting", 0.10), cl.sig("awaiting", 0.10)]
        handles = [s.apply_async() for s in results]
        deadline = time.monotonic() + 60
        while cl.marks.llen("started") < len(handles):
            assert time.monotonic() < deadline, "the 6 tasks did not all start"
            time.sleep(0.05)
        until(lambda: cl.ledger(root)["open"] == 2, "the two async calls reserved")
        t0 = time.time()
        root.abort("stop the threads")
        outcomes = _outcomes(handles)
    ended = [float(x) for x in cl.marks.lrange("ended", 0, -1)]
    assert len(ended) == 6 and max(ended) - t0 < 1.0
    assert all(isinstance(o, TaskStoppedError) and o.reason == "aborted" for o in outcomes)
    ledger = cl.ledger(root)
    assert ledger["open"] == 0 and ledger["held"] == 0
    assert ledger["used"] == 2 * 100_000  # the two cancelled async calls, once each


@pytest.mark.slow
def test_a_sigkilled_workers_reservation_is_reclaimed(redis_cluster: Cluster) -> None:
    cl = redis_cluster
    with cl.root(cost=5.0) as root:
        res = cl.sig("busy", "llm", 0.40).apply_async()
        deadline = time.monotonic() + 30
        while not cl.marks.llen("started"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        until(lambda: cl.ledger(root)["open"] == 1, "the call reserved")
        pid = int(cl.marks.lindex("started", 0).split(":")[1])
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception):  # noqa: B017 - Celery reports WorkerLostError
            res.get(timeout=30)
        time.sleep(1.5)  # past the 1 s lease the dead process can no longer renew
        # the next reserve anywhere in the tree reaps the expired lease
        assert root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) \
            == Decision.ALLOW
    ledger = cl.ledger(root)
    assert ledger["open"] == 0 and ledger["held"] == 0
    assert ledger["used"] == 400_000 + 10_000  # the lost call at its estimate, once
    lost = [n for n in ExecutionContext.load_snapshot(res.id, cl.coord).nodes
            if n.status == "lost"]
    assert len(lost) <= 1


@pytest.mark.slow
def test_sub_tasks_sent_by_a_task_that_returned_still_run_under_it(
        redis_cluster: Cluster) -> None:
    """A body that sends sub-tasks and returns leaves its context open for them (closing
    it would halt them with "closed"); the spend rolls up through it to the root."""
    cl = redis_cluster
    with cl.root(cost=1.0) as root:
        parent = cl.sig("fire_and_forget", 3, 0.05).apply_async()
        ids = parent.get(timeout=30)
        results = [cl.app.AsyncResult(i).get(timeout=30) for i in ids]
        assert [r["calls"] for r in results] == [1, 1, 1]
        assert all(r["path"] == [root.chain_id, parent.id, r["chain_id"]] for r in results)
        assert root.get_snapshot().cost_usd_accumulated == pytest.approx(0.15)
    ledger = cl.ledger(root)
    assert ledger["open"] == 0 and ledger["held"] == 0 and ledger["used"] == 150_000


def test_a_redelivered_task_charges_each_call_once(redis_cluster: Cluster) -> None:
    """acks_late redelivery after a SIGKILL: the body replays in the same context; the call
    that settled in the first delivery is neither run nor charged again, and the call that
    was cut short is settled once, by its replay."""
    cl = redis_cluster
    with cl.root(cost=5.0) as root:
        res = cl.sig("resumable").apply_async()
        deadline = time.monotonic() + 30
        while not cl.marks.get(f"runs:second:{res.id}"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(int(cl.marks.lindex("started", 0).split(":")[1]), signal.SIGKILL)
        out = res.get(timeout=60)  # acks_late + reject_on_worker_lost: delivered again
        time.sleep(1.5)  # past any lease: nothing is left to reap
        assert root.wrap_llm_call(lambda: None) == Decision.ALLOW
    assert out["path"] == [root.chain_id, res.id]  # the same context as the first delivery
    assert cl.coord.store.children(root.root_id, root.chain_id) == [res.id]
    assert cl.marks.get(f"deliveries:{res.id}") == "2"
    assert cl.marks.get(f"runs:first:{res.id}") == "1"   # not replayed: it had settled
    assert cl.marks.get(f"runs:second:{res.id}") == "2"  # cut short, then replayed
    ledger = cl.ledger(root)
    assert ledger["open"] == 0 and ledger["held"] == 0
    # the two calls of the body, each charged once, and the probe call above (it reported
    # nothing: the floor, docs/tokens.md)
    assert ledger["used"] == 100_000 + 50_000 + usd_to_micro(DEFAULT_FLOOR_USD)


def test_a_stopped_body_waits_for_the_other_stopped_bodies_before_its_bookkeeping(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """coordinator.celery.running: when a stop reaches several bodies of a process, the
    first out waits (its result, ack and close would take the GIL) until the last stopped
    one is out; a body that was not stopped never waits."""
    from coordinator.celery import running

    monkeypatch.setattr(running, "MAX_YIELD_S", 30.0)  # only the last one releases it
    first, second, bystander = (CancellationToken() for _ in range(3))
    for token in (first, second, bystander):
        running.enter(token)
    first.cancel("aborted")
    second.cancel("aborted")
    waiting = threading.Thread(target=running.leave, args=(first,))
    waiting.start()
    running.leave(bystander)  # not stopped: returns at once
    waiting.join(0.2)
    assert waiting.is_alive()  # `second` is still running
    running.leave(second)  # the last stopped body: releases `first` and does not wait
    waiting.join(10)
    assert not waiting.is_alive()


def test_calling_a_contained_task_directly_says_to_send_it(coord: Coordinator) -> None:
    """``task()`` runs the body in the caller, with no message and no task id: the
    decorator refuses it clearly (before, an invalid-metadata error named an empty id)."""
    from tests.support.celery_app import solo

    with pytest.raises(RuntimeError, match="through Celery"):
        solo()
