"""A fault stops only what it touches: a tree on a live Cluster primary closes while
another primary is dead, though the close's cross-tree index writes (the root's locator,
the open-trees shard) and other queued writes belong on the dead one; those are sent
once the dead primary's replica took over."""

from __future__ import annotations

import uuid

import pytest
import redis

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
)
from coordinator.core.keys import KeySpace
from coordinator.store.wire import command
from tests.support import procs
from tests.support.topologies import Cluster, wait_for

KS = KeySpace()
BIG = ExecutionConfig(max_cost_usd=10.0, max_steps=1000, max_retries_total=1000)


def _chain_id(cluster: Cluster, tree: int, index: int | None = None) -> str:
    """A root id whose tree lives on primary ``tree`` and, if ``index`` is given, its
    index keys (locator, open-trees shard) on ``index``."""
    while True:
        chain_id = uuid.uuid4().hex
        if cluster.primary_index(KS.reservations(chain_id)) == tree and (
                index is None or (cluster.primary_index(KS.locator(chain_id)) == index
                                  and cluster.primary_index(KS.roots_shard(chain_id)) == index)):
            return chain_id


def _everyone(cluster: Cluster) -> redis.RedisCluster:
    return redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[1].port,
                              decode_responses=True)


def _root(coord: Coordinator, chain_id: str) -> ExecutionContext:
    root = ExecutionContext(BIG, coordinator=coord,
                            metadata=ChainMetadata(request_id=chain_id, chain_id=chain_id))
    d = root.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.001))
    assert d == Decision.ALLOW  # opened, and a call settled
    return root


@pytest.mark.slow
def test_a_tree_on_a_live_primary_closes_while_its_index_node_is_dead() -> None:
    with Cluster(replicas=1) as cluster:
        coord = Coordinator.from_url(cluster.node_url(1), token_keys=procs.TEST_KEYS)
        chain_id = _chain_id(cluster, tree=1, index=0)
        root = _root(coord, chain_id)
        on_dead = _chain_id(cluster, tree=0)
        _root(coord, on_dead).detach()
        live = redis.Redis(port=cluster.nodes[1].port, decode_responses=True)
        everyone = _everyone(cluster)
        assert everyone.zscore(KS.roots_shard(chain_id), chain_id) is not None

        cluster.nodes[0].kill()
        # a write queued for the dead primary: the flusher cannot land it yet
        coord.store.wire.queue(command("EXPIRE", KS.ctx(on_dead, on_dead), 3600))
        root.close()
        assert live.hget(KS.ctx(chain_id, chain_id), "status") == "closed"
        assert live.ttl(KS.ctx(chain_id, chain_id)) > 0  # its retention clock runs

        replica = cluster.replica_of(0)
        wait_for(lambda: redis.Redis(port=replica.port).info("replication")["role"]
                 == "master", 30, "the replica's promotion")
        everyone = _everyone(cluster)
        # the queued index writes land on the promoted replica (the flusher retries them)
        wait_for(lambda: everyone.zscore(KS.roots_shard(chain_id), chain_id) is None, 20,
                 "the open-trees shard to drop the closed root")
        assert everyone.ttl(KS.locator(chain_id)) > 0
        coord.close()
