"""Context data (CCOS execution-context specification): the specification's examples,
isolation levels, merges, post-mortem reads, retention and round trips, in one process."""

from __future__ import annotations

import pytest
import redis

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    IsolationLevel,
    MergePolicy,
    WrapOptions,
    run_parallel,
)
from coordinator.data import DataClosedError, DataKeys, NoParentError

CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# -- the specification's examples ------------------------------------------------------


def test_fetch_user_then_send_email(coord: Coordinator) -> None:
    """(step "Fetch User" ... (set! :user user)) then (step "Send Email" ... (get :user))."""
    sent: list[dict[str, str]] = []

    def get_user(user_id: int) -> dict[str, object]:
        return {"id": user_id, "email": f"user{user_id}@example.com"}

    with ExecutionContext(CONFIG) as plan:
        with plan.spawn_child(step_name="Fetch User") as step:
            user: dict[str, object] = {}
            step.wrap_tool_call(lambda: user.update(get_user(42)),
                                WrapOptions(operation_name="app.user:get"))
            step.data.set("user", user)
            step.merge_into_parent()
        with plan.spawn_child(step_name="Send Email") as step:
            found = step.data.get("user")
            assert step.data.level_of("user") == 1  # read through to the plan
            d = step.wrap_tool_call(
                lambda: sent.append({"to": found["email"], "template": "welcome"}),
                WrapOptions(operation_name="app.email:send"))
            assert d == Decision.ALLOW
    assert sent == [{"to": "user42@example.com", "template": "welcome"}]


def test_parallel_render_pdf_and_index_search(coord: Coordinator) -> None:
    """(step-parallel (step "Render PDF" ...) (step "Index Search" ...)): isolated
    branches; the parent is not changed until the merge."""
    with ExecutionContext(CONFIG) as plan:
        plan.data.set("doc_id", 42)
        seen: dict[str, object] = {}

        def render(branch: ExecutionContext) -> str:
            branch.data.set("pdf", f"pdf-of-{branch.data.get('doc_id')}")
            seen["render_parent_pdf"] = plan.data.get("pdf", "<none>")
            return "rendered"

        def index(branch: ExecutionContext) -> str:
            branch.data.set("indexed", True)
            seen["index_sees_pdf"] = branch.data.get("pdf", "<none>")
            return "indexed"

        results, merges = run_parallel(plan, {"Render PDF": render, "Index Search": index})
        assert results == {"Render PDF": "rendered", "Index Search": "indexed"}
        assert seen == {"render_parent_pdf": "<none>", "index_sees_pdf": "<none>"}
        assert merges["Render PDF"].added == ("pdf",)
        assert merges["Index Search"].added == ("indexed",)
        assert plan.data.to_dict() == {"doc_id": 42, "pdf": "pdf-of-42", "indexed": True}


def test_parallel_children_are_isolated_and_marked(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as plan:
        a, b = plan.parallel(["A", "B"])
        stack = a.checkpoint("branch-a")["stack"]
        meta = stack[-1]["metadata"]
        assert meta["is_parallel"] is True
        assert meta["isolation_level"] == "isolated"
        assert meta["step_name"] == "A"
        assert b.data.isolation is IsolationLevel.ISOLATED
        a.close()
        b.close()


def test_merge_keep_existing_parent_wins(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as plan:
        plan.data.set("k", "parent")

        def a(ctx: ExecutionContext) -> None:
            ctx.data.update({"k": "child-a", "a": 1})

        def b(ctx: ExecutionContext) -> None:
            ctx.data.update({"k": "child-b", "b": 2})

        _, merges = run_parallel(plan, {"A": a, "B": b})  # keep_existing is the default
        assert plan.data.to_dict() == {"k": "parent", "a": 1, "b": 2}
        assert merges["A"].added == ("a",) and merges["A"].overwritten == ()


def test_merge_overwrite_and_manual_choice(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as plan:
        plan.data.set("candidate", "none")
        results, merges = run_parallel(
            plan, {"A": lambda c: c.data.set("candidate", "a"),
                   "B": lambda c: c.data.set("candidate", "b")},
            policy="overwrite")
        # overwrite: the branches merge in the order given, so the last one wins
        assert plan.data.get("candidate") == "b"
        assert merges["A"].overwritten == ("candidate",)
        # the specification's manual way: select the value and set it in the parent
        some_condition = True
        plan.data.set("candidate", "a" if some_condition else "b")
        assert plan.data.get("candidate") == "a"


def test_merge_deep(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as plan:
        plan.data.update({"cfg": {"retries": 1, "tags": ["x"], "db": {"host": "a"}},
                          "log": ["start"], "n": 1})
        child = plan.spawn_child()
        child.data.update({"cfg": {"tags": ["y"], "db": {"port": 5432}, "new": None},
                           "log": ["child"], "n": 2, "extra": []})
        res = child.merge_into_parent(MergePolicy.MERGE)
        assert plan.data.to_dict() == {
            "cfg": {"retries": 1, "tags": ["x", "y"], "db": {"host": "a", "port": 5432},
                    "new": None},
            "log": ["start", "child"], "n": 2, "extra": []}
        assert res.merged == ("cfg", "log", "n") and res.added == ("extra",)
        # only the keys asked for
        child.data.set("only", 1)
        child.data.set("not_this", 2)
        assert child.merge_into_parent("overwrite", keys=["only"]).added == ("only",)
        assert "not_this" not in plan.data
        child.close()


def test_merge_keeps_numbers_exact(coord: Coordinator) -> None:
    """Deep merges re-encode JSON in Lua: floats keep every digit, big ints stay ints."""
    with ExecutionContext(CONFIG) as plan:
        plan.data.set("m", {"x": 0.1 + 0.2, "big": 2**70, "e": [], "o": {}})
        child = plan.spawn_child()
        child.data.set("m", {"y": 1e-300, "e": [[]], "o": {"k": {}}})
        child.merge_into_parent("merge")
        assert plan.data.get("m") == {"x": 0.1 + 0.2, "big": 2**70, "e": [[]],
                                      "o": {"k": {}}, "y": 1e-300}
        child.close()


@pytest.mark.parametrize("cost,path", [(150, "Budget Path"), (80, "Premium Path")])
def test_conditional_step_reads_a_value(coord: Coordinator, cost: int, path: str) -> None:
    """(step-if (> (get :cost) 100) (step "Budget Path" ...) (step "Premium Path" ...))."""
    with ExecutionContext(CONFIG) as plan:
        with plan.spawn_child(step_name="Estimate") as est:
            est.data.set("cost", cost)
            est.merge_into_parent()
        chosen = "Budget Path" if plan.data.get("cost") > 100 else "Premium Path"
        with plan.spawn_child(step_name=chosen) as step:
            step.data.set("path", chosen)
            step.merge_into_parent()
        assert plan.data.get("path") == path


# -- isolation -------------------------------------------------------------------------


def test_isolation_levels(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.update({"k": "v1", "only_root": 1})
        inherit = root.spawn_child()
        isolated = root.spawn_child(isolation="isolated")
        sandboxed = root.spawn_child(isolation=IsolationLevel.SANDBOXED)
        deep = inherit.spawn_child().spawn_child()
        under_isolated = isolated.spawn_child()
        root.data.set("k", "v2")
        sib = root.spawn_child()
        sib.data.set("late", 1)
        sib.merge_into_parent()
        assert inherit.data.get("k") == "v2" and deep.data.get("k") == "v2"
        assert deep.data.level_of("k") == 3
        assert isolated.data.get("k") == "v1"  # as it was at creation
        assert isolated.data.get("late") is None  # a sibling's later merge is not seen
        assert under_isolated.data.get("k") == "v1"  # below it: the same frozen view
        assert sandboxed.data.get("k") is None and sandboxed.data.to_dict() == {}
        assert isolated.data.to_dict() == {"k": "v1", "only_root": 1}
        # writes are local, reads fall back: the parent is not mutated
        inherit.data.set("k", "mine")
        assert inherit.data.get("k") == "mine" and root.data.get("k") == "v2"
        assert inherit.data.delete("k") is True and inherit.data.get("k") == "v2"
        assert inherit.data.delete("k") is False
        assert inherit.data.keys(local=True) == []
        assert isolated.data.isolation is IsolationLevel.ISOLATED
        assert inherit.data.isolation is IsolationLevel.INHERIT
        for c in (deep, under_isolated, inherit, isolated, sandboxed, sib):
            c.close()


# -- lifecycle -------------------------------------------------------------------------


def test_post_mortem_read_and_merge_after_abort(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        child = root.spawn_child()
        child.data.set("partial", [1, 2])
        child.abort("operator")
        assert child.wrap_llm_call(lambda: None) == Decision.HALT
        assert child.data.get("partial") == [1, 2]  # readable after the stop
        child.data.set("more", 3)  # still open: a stopped context takes writes
        child.close()
        assert child.data.get("partial") == [1, 2]  # readable after close
        with pytest.raises(DataClosedError):
            child.data.set("late", 1)
        other = ExecutionContext.attach(child.token)
        with pytest.raises(DataClosedError):  # refused in Redis too (closed while stopped)
            other.data.set("late", 1)
        assert child.merge_into_parent().added == ("more", "partial")
        assert root.data.get("partial") == [1, 2]
        with pytest.raises(NoParentError):
            root.merge_into_parent()
    late = root.spawn_child()
    late.data.set("x", 1)
    with pytest.raises(DataClosedError):  # the parent is closed
        late.merge_into_parent()
    assert "x" not in root.data
    late.close()


def test_data_expires_with_the_tree(coord: Coordinator) -> None:
    client = coord.client
    dk = DataKeys(coord.keyspace)
    with ExecutionContext(CONFIG) as root:
        root.data.set("a", 1)
        child = root.spawn_child(isolation="isolated")
        child.data.set("b", 2)
        root.checkpoint("exp-1")
        root.spawn_child(step_name="a step").close()  # writes the tree's causal chain
        assert client.ttl(dk.data(root.chain_id, root.chain_id)) == -1
        child.close()
        for key in dk.context_keys(root.chain_id, child.chain_id):
            assert 0 < client.ttl(key) <= coord.retention_s, key
    for key in dk.tree_keys(root.chain_id):
        assert 0 < client.ttl(key) <= coord.retention_s, key
    for key in dk.context_keys(root.chain_id, root.chain_id):
        if client.exists(key):
            assert 0 < client.ttl(key) <= coord.retention_s, key
    assert client.exists(dk.data(root.chain_id, root.chain_id))


def test_get_and_set_are_one_round_trip_at_any_depth(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.set("top", "t")
        ctx = root
        chain = []
        for _ in range(8):
            ctx = ctx.spawn_child()
            chain.append(ctx)
        ctx.data.get("warm-up")
        before = evalsha_calls(coord.client)
        assert ctx.data.get("top") == "t"
        assert evalsha_calls(coord.client) - before == 1
        ctx.data.set("k", 1)
        assert evalsha_calls(coord.client) - before == 2
        for c in reversed(chain):
            c.close()


def test_scripts_reload_after_script_flush(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.set("a", 1)
        coord.client.script_flush()
        assert root.data.get("a") == 1
        root.data.set("b", 2)
        assert root.data.to_dict() == {"a": 1, "b": 2}


def test_many_keys_at_once(coord: Coordinator) -> None:
    """Thousands of keys in one update, merge and frozen view (Lua's unpack() has a
    limit of a few thousand values: the scripts write in slices)."""
    many = {f"k{i}": i for i in range(6000)}
    with ExecutionContext(CONFIG) as root:
        child = root.spawn_child()
        child.data.update(many)
        assert child.merge_into_parent().added == tuple(sorted(many))
        frozen = root.spawn_child(isolation="isolated")
        root.data.set("k0", "changed")
        assert frozen.data.get("k0") == 0 and len(frozen.data.keys()) == 6000
        assert root.data.to_dict() == {**many, "k0": "changed"}
        for c in (child, frozen):
            c.close()
