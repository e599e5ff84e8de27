"""Context ids are unique across trees: the locator (``bc:where:<id>`` -> root) of a
context is never taken over by another tree's open, which is refused like an id taken in
the same tree, and leaves nothing behind."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from coordinator.core.paths import Path
from coordinator.embedded import RedisServer
from coordinator.errors import ContextExistsError, ContextNotFoundError
from coordinator.store.tree import Opened, OpenRefused
from coordinator.store.wire import Wire
from tests.support.invariants import check_tree
from tests.support.procs import TEST_KEYS

CFG = ExecutionConfig(max_cost_usd=1.0, max_steps=20, max_retries_total=3)


def meta(chain_id: str) -> ChainMetadata:
    return ChainMetadata(request_id="r", chain_id=chain_id)


def spend(ctx: ExecutionContext, usd: float) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


def dump(client: redis.Redis) -> dict[str, Any]:
    """Every key of the database with its type, value and whether it expires."""
    out: dict[str, Any] = {}
    for key in sorted(client.scan_iter("*")):
        kind = client.type(key)
        value: Any
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        else:
            value = None
        out[key] = (kind, value, client.ttl(key) > 0)
    return out


def other_coord(url: str) -> Iterator[Coordinator]:
    c = Coordinator.from_url(url, token_keys=TEST_KEYS)
    try:
        yield c
    finally:
        c.close()
        c.client.close()


@pytest.fixture
def coord2(redis_url: str) -> Iterator[Coordinator]:
    """A second coordinator on the same database: another process's."""
    yield from other_coord(redis_url)


def tree_with_spent_child(coord: Coordinator, child_id: str) -> tuple[ExecutionContext,
                                                                     ExecutionContext]:
    root = ExecutionContext(CFG, metadata=meta("tree-a"), coordinator=coord)
    child = root.spawn_child(max_cost_usd=0.5, metadata=meta(child_id))
    assert spend(child, 0.25) == Decision.ALLOW
    coord.store.flush()
    return root, child


# -- the defect: another tree's open used to overwrite the locator ---------------------


def test_a_new_root_cannot_take_the_id_of_another_trees_child(
        coord: Coordinator, coord2: Coordinator, redis_url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, child = tree_with_spent_child(coord, "shared-id")
    before = dump(coord.client)

    with pytest.raises(ContextExistsError) as err:
        ExecutionContext(CFG, metadata=meta("shared-id"), coordinator=coord2)
    assert err.value.chain_id == "shared-id"

    # nothing of the refused root remains; the other tree is untouched, locator included
    assert dump(coord.client) == before
    assert not coord.client.keys("bc:{shared-id}*")
    assert coord.views.active_roots() == ["tree-a"]
    assert coord.views.locate("shared-id") == "tree-a"

    # every view by id still reaches the child that recorded the spend
    snap = ExecutionContext.load_snapshot("shared-id", coord2)
    assert snap.cost_usd_accumulated == pytest.approx(0.25)
    assert (snap.root_chain_id, snap.parent_chain_id, snap.step_count) == ("tree-a", "tree-a", 1)
    assert main(["--redis", redis_url, "tree", "shared-id"]) == 0
    assert "$0.2500 / $0.5000" in capsys.readouterr().out
    assert main(["--redis", redis_url, "abort", "shared-id", "ops said so"]) == 0
    assert "aborted shared-id" in capsys.readouterr().out
    assert child.get_snapshot().abort_reason == "aborted"
    assert root.get_snapshot().status == "running"  # only the child's subtree stopped
    child.close()
    root.close()
    check_tree(coord.client, "tree-a")


def test_a_child_cannot_take_the_id_of_another_trees_root(coord: Coordinator,
                                                          coord2: Coordinator) -> None:
    other = ExecutionContext(CFG, metadata=meta("tree-t"), coordinator=coord)
    assert spend(other, 0.3) == Decision.ALLOW
    mine = ExecutionContext(CFG, metadata=meta("tree-r"), coordinator=coord2)
    coord.store.flush()
    coord2.store.flush()
    before = dump(coord.client)

    with pytest.raises(ContextExistsError):
        mine.spawn_child(metadata=meta("tree-t"))
    with pytest.raises(ContextExistsError):  # the way a Celery task opens its context
        ExecutionContext.spawn_from_token(mine.token, coord2, metadata=meta("tree-t"))

    assert dump(coord.client) == before
    ks = coord.keyspace
    assert not coord.client.exists(ks.ctx("tree-r", "tree-t"))
    assert coord.store.children("tree-r", "tree-r") == []
    assert coord.views.locate("tree-t") == "tree-t"
    snap = ExecutionContext.load_snapshot("tree-t", coord2)
    assert snap.cost_usd_accumulated == pytest.approx(0.3) and snap.parent_chain_id is None

    # both trees go on as before, and a free id still opens in the refusing tree
    assert spend(mine, 0.1) == Decision.ALLOW
    kid = mine.spawn_child(metadata=meta("tree-r-kid"))
    assert coord.views.locate("tree-r-kid") == "tree-r"
    kid.close()
    mine.close()
    other.close()
    check_tree(coord.client, "tree-r")
    check_tree(coord.client, "tree-t")


def test_a_child_cannot_take_the_id_of_another_trees_child(coord: Coordinator,
                                                           coord2: Coordinator) -> None:
    root, child = tree_with_spent_child(coord, "worker-1")
    mine = ExecutionContext(CFG, metadata=meta("tree-b"), coordinator=coord2)
    coord2.store.flush()
    before = dump(coord.client)
    with pytest.raises(ContextExistsError):
        mine.spawn_child(metadata=meta("worker-1"))
    assert dump(coord.client) == before
    assert ExecutionContext.load_snapshot("worker-1", coord2).root_chain_id == "tree-a"
    for ctx in (child, root, mine):
        ctx.close()


def test_a_celery_task_whose_id_is_another_trees_context_records_nothing(
        coord: Coordinator, coord2: Coordinator) -> None:
    """The task decorator rejoins on ContextExistsError (a redelivered message): with an
    id of another tree there is nothing to rejoin in its own tree, so the task fails with
    ContextExistsError, and nothing is charged to or written in either tree."""
    from coordinator.celery.decorator import _open

    root, _ = tree_with_spent_child(coord, "task-id")
    mine = ExecutionContext(CFG, metadata=meta("tree-b"), coordinator=coord2)
    coord2.store.flush()
    before = dump(coord.client)
    for token in (None, mine.token):
        with pytest.raises(ContextExistsError):
            _open(coord2, token, meta("task-id"), CFG, None, None, None, 0, None)
    assert dump(coord.client) == before
    assert ExecutionContext.load_snapshot("task-id", coord2).cost_usd_accumulated == \
        pytest.approx(0.25)


# -- the same tree behaves as before ---------------------------------------------------


def test_a_taken_id_in_the_same_tree_is_refused_as_before(coord: Coordinator) -> None:
    root = ExecutionContext(CFG, metadata=meta("same"), coordinator=coord)
    child = root.spawn_child(metadata=meta("same-kid"))
    coord.store.flush()
    before = dump(coord.client)
    with pytest.raises(ContextExistsError):
        ExecutionContext(CFG, metadata=meta("same"), coordinator=coord)
    with pytest.raises(ContextExistsError):
        root.spawn_child(metadata=meta("same-kid"))
    with pytest.raises(ContextExistsError):
        child.spawn_child(metadata=meta("same"))  # the root's id, lower in its own tree
    assert dump(coord.client) == before  # the root's time among the open trees included
    child.close()
    root.close()


def test_a_refused_reopen_of_a_closed_tree_changes_nothing(
        coord: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Opening the id of a closed tree is refused and leaves the open-trees index (and
    so ``budgetctl top``) as it was: the closed tree is not listed as open again."""
    done = ExecutionContext(CFG, metadata=meta("done-tree"), coordinator=coord)
    assert spend(done, 0.2) == Decision.ALLOW
    done.close()
    live = ExecutionContext(CFG, metadata=meta("live-tree"), coordinator=coord)
    coord.store.flush()
    before = dump(coord.client)
    for taken in ("done-tree", "live-tree"):
        with pytest.raises(ContextExistsError):
            ExecutionContext(CFG, metadata=meta(taken), coordinator=coord)
    assert dump(coord.client) == before  # the open-trees index and its times included
    assert coord.views.active_roots() == ["live-tree"]
    capsys.readouterr()
    assert main(["--redis", redis_url, "top", "--json"]) == 0
    assert [t["id"] for t in json.loads(capsys.readouterr().out)["trees"]] == ["live-tree"]
    live.close()


def test_a_retried_open_whose_first_attempt_went_through_still_opens(
        coord: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open lands but its reply is lost: the handle opens later, in the context its
    first attempt created (open says 'exists'; the locator already points to its tree)."""
    real = Wire.round_trip
    lost: list[int] = []

    def lose_first_reply(self: Wire, ops: Any, reads: Any = None) -> list[Any]:
        results = real(self, ops, reads)
        if not lost and any(op.kind == "open" for op in ops):
            lost.append(1)
            raise redis.ConnectionError("connection reset")
        return results

    root = ExecutionContext(CFG, metadata=meta("retried"), coordinator=coord)
    monkeypatch.setattr(Wire, "round_trip", lose_first_reply)
    for opener in (lambda: ExecutionContext(CFG, metadata=meta("retried-root"),
                                            coordinator=coord),
                   lambda: root.spawn_child(metadata=meta("retried-kid"))):
        lost.clear()
        ctx = opener()
        assert lost  # its open went through, the caller did not hear it
        deadline = time.monotonic() + 10  # the lost reply opened the backend breaker:
        while coord.backend.down:  # calls flow again once its probe hears Redis
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert spend(ctx, 0.1) == Decision.ALLOW  # opens on first use: 'exists' is its own
        snap = ExecutionContext.load_snapshot(ctx.chain_id, coord)
        assert snap.cost_usd_accumulated == pytest.approx(0.1)
        assert coord.views.locate(ctx.chain_id) == ctx.root_id
        ctx.close()
    root.close()
    check_tree(coord.client, "retried")
    check_tree(coord.client, "retried-root")


def test_a_redelivered_task_rejoins_its_context(coord: Coordinator,
                                                coord2: Coordinator) -> None:
    from coordinator.celery.decorator import _open

    parent = ExecutionContext(CFG, metadata=meta("celery-parent"), coordinator=coord)
    for token, path in ((None, ("task-1",)), (parent.token, ("celery-parent", "task-2"))):
        first, rejoined = _open(coord, token, meta(path[-1]), CFG, None, None, None, 0, None)
        assert not rejoined and first.path == path
        assert spend(first, 0.05) == Decision.ALLOW
        coord.store.flush()
        again, rejoined = _open(coord2, token, meta(path[-1]), CFG, None, None, None, 0, None)
        assert rejoined and again.path == path
        assert again.get_snapshot().cost_usd_accumulated == pytest.approx(0.05)
        assert coord.views.locate(path[-1]) == path[0]
        again.detach()
        first.close()
    parent.close()


# -- refusals leave no locator ----------------------------------------------------------


def test_an_open_refused_for_a_missing_ancestor_keeps_no_locator(coord: Coordinator,
                                                                 coord2: Coordinator) -> None:
    root = ExecutionContext(CFG, metadata=meta("has-no-ghost"), coordinator=coord)
    ghost = coord.token_codec().encode(root="has-no-ghost", path=("has-no-ghost", "ghost"),
                               tenant=coord.tenant, ttl_s=60, now=coord.redis_now_ms() / 1000)
    with pytest.raises(ContextNotFoundError):
        ExecutionContext.spawn_from_token(ghost, coord, metadata=meta("orphan"))
    assert coord.views.locate("orphan") is None
    assert not coord.client.keys("*orphan*")
    # so the id is still free for any tree
    elsewhere = ExecutionContext(CFG, metadata=meta("orphan"), coordinator=coord2)
    assert coord.views.locate("orphan") == "orphan"
    elsewhere.close()
    root.close()


# -- two processes opening the same new id at once -------------------------------------


@pytest.fixture
def race() -> Iterator[Callable[..., list[ExecutionContext | None]]]:
    """Runs openers at once, each in its own thread (the same two threads every time:
    each thread keeps its own connection); a result is the context, or None if refused."""
    pool = ThreadPoolExecutor(max_workers=2)

    def run(*openers: Callable[[], ExecutionContext]) -> list[ExecutionContext | None]:
        barrier = threading.Barrier(len(openers))

        def attempt(opener: Callable[[], ExecutionContext]) -> ExecutionContext | None:
            barrier.wait(timeout=10)
            try:
                return opener()
            except ContextExistsError:
                return None

        return [f.result() for f in [pool.submit(attempt, o) for o in openers]]

    yield run
    pool.shutdown()


def test_two_trees_opening_the_same_new_id_at_once_one_wins(
        coord: Coordinator, coord2: Coordinator,
        race: Callable[..., list[ExecutionContext | None]]) -> None:
    a = ExecutionContext(CFG, metadata=meta("race-a"), coordinator=coord)
    b = ExecutionContext(CFG, metadata=meta("race-b"), coordinator=coord2)
    ks = coord.keyspace
    client = coord.client
    for i in range(40):
        kid, new_root = f"kid-{i}", f"new-{i}"
        # a child in each tree
        got = race(lambda kid=kid: a.spawn_child(metadata=meta(kid)),
                   lambda kid=kid: b.spawn_child(metadata=meta(kid)))
        won = [c for c in got if c is not None]
        assert len(won) == 1, got
        winner = won[0].root_id
        loser = "race-b" if winner == "race-a" else "race-a"
        assert coord.views.locate(kid) == winner
        assert client.exists(ks.ctx(winner, kid)) and not client.exists(ks.ctx(loser, kid))
        assert kid in coord.store.children(winner, winner)
        assert kid not in coord.store.children(loser, loser)
        # a new root against a child of a tree
        got = race(lambda r=new_root: ExecutionContext(
                       CFG, metadata=meta(r), coordinator=coord2),
                   lambda r=new_root: a.spawn_child(metadata=meta(r)))
        won = [c for c in got if c is not None]
        assert len(won) == 1, got
        if won[0].root_id == new_root:
            assert coord.views.locate(new_root) == new_root
            assert not client.exists(ks.ctx("race-a", new_root))
            assert new_root not in coord.store.children("race-a", "race-a")
            assert new_root in coord.views.active_roots(limit=1000)
        else:
            assert coord.views.locate(new_root) == "race-a"
            assert not client.keys(f"bc:{{{new_root}}}*")
            assert new_root not in coord.views.active_roots(limit=1000)
    a.close()
    b.close()


def test_two_opens_of_the_same_new_id_in_one_tree_at_once(
        coord: Coordinator, coord2: Coordinator,
        race: Callable[..., list[ExecutionContext | None]]) -> None:
    a = ExecutionContext(CFG, metadata=meta("one-tree"), coordinator=coord)
    a2 = ExecutionContext.attach(a.token, coord2)
    for i in range(20):
        kid = f"twin-{i}"
        got = race(lambda kid=kid: a.spawn_child(metadata=meta(kid)),
                   lambda kid=kid: a2.spawn_child(metadata=meta(kid)))
        assert len([c for c in got if c is not None]) == 1
        assert coord.views.locate(kid) == "one-tree"
        assert coord.store.read_hash("one-tree", kid)["status"] == "running"
    a.close()


# -- the second round trip is allowed to the coordinator's documented ACL user ----------


def test_the_refusal_works_under_the_documented_acl() -> None:
    from tests.project.test_deploy import documented_acl_user

    with RedisServer() as server:
        url = documented_acl_user(server)
        admin = redis.Redis.from_url(server.url)
        for c in other_coord(url):
            root = ExecutionContext(CFG, metadata=meta("acl-a"), coordinator=c)
            root.spawn_child(metadata=meta("acl-kid"))
            with pytest.raises(ContextExistsError):
                ExecutionContext(CFG, metadata=meta("acl-kid"), coordinator=c)
            other = ExecutionContext(CFG, metadata=meta("acl-b"), coordinator=c)
            with pytest.raises(ContextExistsError):
                other.spawn_child(metadata=meta("acl-a"))
            ghost = c.token_codec().encode(root="acl-a", path=("acl-a", "ghost"), tenant=c.tenant,
                                   ttl_s=60, now=c.redis_now_ms() / 1000)
            with pytest.raises(ContextNotFoundError):
                ExecutionContext.spawn_from_token(ghost, c, metadata=meta("acl-orphan"))
            assert c.views.locate("acl-kid") == "acl-a"
            assert c.views.locate("acl-orphan") is None
            assert not admin.exists("bc:{acl-kid}:ctx:acl-kid", "bc:{acl-b}:ctx:acl-a")
        admin.close()


def test_open_refusals_through_the_store(coord: Coordinator) -> None:
    """Store.open itself: 'exists' for an id located in another tree, the ancestor
    refusals unchanged when the id is free."""
    store = coord.store
    kw: dict[str, Any] = dict(request_id="r", meta_json="{}", config_json="{}",
                              timeout_ms=0, deadline_ms=0, triples=[])
    assert isinstance(store.open(Path("t1", ("t1",)), **kw), Opened)
    assert isinstance(store.open(Path("t1", ("t1", "x")), **kw), Opened)
    assert store.open(Path("t2", ("t2",)), **kw) != OpenRefused("exists")
    assert store.open(Path("t2", ("t2", "x")), **kw) == OpenRefused("exists")
    assert store.open(Path("x", ("x",)), **kw) == OpenRefused("exists")
    # same tree: as before
    assert store.open(Path("t1", ("t1", "x")), **kw) == OpenRefused("exists")
    assert store.open(Path("t2", ("t2", "nope", "y")), **kw) == OpenRefused("missing", "nope")
    assert coord.views.locate("y") is None
    assert store.open(Path("t2", ("t2", "nope", "x")), **kw) == OpenRefused("missing", "nope")
    assert coord.views.locate("x") == "t1"
    assert coord.views.active_roots() == ["t1", "t2"]


def test_an_open_whose_claim_fails_leaves_no_context() -> None:
    """A claim Redis refuses (here: an ACL without SET; likewise a Redis before 7.0, which
    has no SET NX GET) fails the open without leaving the context the script created."""
    from tests.project.test_deploy import _documented_acl

    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        admin.execute_command("ACL", "SETUSER", "no-set", "on", ">svc-password-123",
                              "resetkeys", "resetchannels", "-@all", *_documented_acl(),
                              "-set")
        url = server.url.replace("redis://", "redis://no-set:svc-password-123@")
        for c in other_coord(url):
            with pytest.raises(redis.exceptions.NoPermissionError):
                ExecutionContext(CFG, metadata=meta("unclaimed"), coordinator=c)
            assert admin.keys("*") == []
        admin.close()
