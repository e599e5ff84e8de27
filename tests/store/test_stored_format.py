"""The context hash's stored form (lua/open.lua): small enough for Redis' listpack
encoding in shallow trees, and still readable, and extendable, when an earlier version
wrote the whole path as ``path`` instead of ``mid``."""

from __future__ import annotations

import pytest

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.errors import TokenMalformedError

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)


def test_shallow_contexts_are_stored_as_listpacks(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        child = root.spawn_child()
        grandchild = child.spawn_child()
        assert grandchild.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)
                                        ) == Decision.ALLOW
        coord.store.flush()
        for ctx in (root, child, grandchild):
            key = coord.keyspace.ctx(root.root_id, ctx.chain_id)
            assert coord.client.object("encoding", key) in ("listpack", "ziplist"), (  # 7 / 6.2
                coord.client.hgetall(key))
        stored = coord.client.hgetall(coord.keyspace.ctx(root.root_id, grandchild.chain_id))
        assert stored["mid"] == child.chain_id and "path" not in stored


def _as_earlier_version_wrote_it(coord: Coordinator, root: str, ctx: ExecutionContext,
                                 path: list[str]) -> None:
    key = coord.keyspace.ctx(root, ctx.chain_id)
    coord.client.hdel(key, "mid")
    coord.client.hset(key, "path", ",".join(path))


def test_a_tree_stored_with_whole_paths_still_grows_and_reads(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        child = root.spawn_child()
        grandchild = child.spawn_child()
        coord.store.flush()
        ids = [root.chain_id, child.chain_id, grandchild.chain_id]
        _as_earlier_version_wrote_it(coord, root.root_id, child, ids[:2])
        _as_earlier_version_wrote_it(coord, root.root_id, grandchild, ids)

        below = grandchild.spawn_child()  # open.lua checks each ancestor's stored path
        assert below.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.02)
                                   ) == Decision.ALLOW
        attached = ExecutionContext.attach(grandchild.token, coordinator=coord)
        assert attached.get_snapshot().chain_id == grandchild.chain_id
        snap = ExecutionContext.load_snapshot(grandchild.chain_id, coord)
        assert snap.parent_chain_id == child.chain_id
        assert root.get_snapshot().cost_usd_accumulated > 0

        # a stored path that does not lead here still refuses a graft
        key = coord.keyspace.ctx(root.root_id, grandchild.chain_id)
        coord.client.hset(key, "path", ",".join([root.chain_id, "elsewhere",
                                                 grandchild.chain_id]))
        with pytest.raises(TokenMalformedError, match="not at that place in the tree"):
            grandchild.spawn_child()
