"""Context data through Celery: a group of isolated @contained branches, merged into
their parent by the chord callback (the specification's parallel steps), in real worker
processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery, chord, group

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, merge_children
from coordinator.celery import install
from coordinator.data import DataKeys
from coordinator.embedded import RedisServer
from coordinator.errors import ContextNotFoundError
from tests.support.celery_app_harness import TOKEN_KEYS, Workers

APP = "tests.support.celery_data_app"
T = APP + "."


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Celery, Coordinator]]:
    with RedisServer() as server:
        base = f"redis://127.0.0.1:{server.port}"
        env = {"BC_BROKER_URL": base + "/1", "BC_BACKEND_URL": base + "/2",
               "BC_QUEUE": f"bc-data-{uuid.uuid4().hex[:10]}",
               "BUDGET_REDIS_URL": base + "/0", "BUDGET_TOKEN_KEYS": TOKEN_KEYS,
               "PYTHONWARNINGS": "ignore"}
        install()
        app = Celery("bc_data_client", broker=env["BC_BROKER_URL"],
                     backend=env["BC_BACKEND_URL"])
        app.conf.update(task_default_queue=env["BC_QUEUE"], result_expires=600,
                        broker_connection_retry_on_startup=True)
        kid, _, secret = TOKEN_KEYS.partition(":")
        coord = Coordinator.from_url(env["BUDGET_REDIS_URL"],
                                     token_keys={kid: secret.encode()})
        with Workers(app, APP, env, count=1, concurrency=2):
            yield app, coord
        coord.close()
        app.close()


def test_group_of_isolated_branches_merged_by_the_chord(
        cluster: tuple[Celery, Coordinator]) -> None:
    app, coord = cluster
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)
    with ExecutionContext(config, coordinator=coord) as plan:
        plan.data.update({"doc": 42, "k": "parent"})
        branches = group(app.signature(T + "render_pdf", args=("doc",)),
                         app.signature(T + "index_search", args=("doc",)))
        merged = chord(branches, app.signature(T + "consolidate", args=("merge",))
                       ).apply_async().get(timeout=60)
        kids = coord.store.children(plan.root_id, plan.chain_id)
        data = plan.data.to_dict()
        with pytest.raises(ContextNotFoundError):  # only children of the parent merge
            merge_children(plan, [plan.chain_id])
    assert data == {"doc": 42, "k": "from-index", "pdf": "pdf-of-42", "indexed": True}
    assert sorted(merged.values()) == [["indexed", "k"], ["pdf"]]
    assert set(merged) <= set(kids)  # the branches were children of the plan
    dk = DataKeys(coord.keyspace)
    assert all(coord.client.hget(dk.meta(plan.root_id, cid), "iso") == "isolated"
               for cid in merged)
