"""The Celery app of the context-data integration test (run in real worker
subprocesses, configured from the environment like tests/support/celery_app.py)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from coordinator import merge_children
from coordinator.celery import contained, current_context, install

app = Celery("bc_data_tests")
app.conf.update(
    broker_url=os.environ.get("BC_BROKER_URL", "memory://"),
    result_backend=os.environ.get("BC_BACKEND_URL") or None,
    task_default_queue=os.environ.get("BC_QUEUE", "celery"),
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
install(app)


def _here() -> Any:
    ctx = current_context()
    assert ctx is not None
    return ctx


@app.task
@contained(isolation="isolated")
def render_pdf(doc_key: str) -> dict[str, Any]:
    """Step "Render PDF": an isolated branch of a group."""
    ctx = _here()
    ctx.data.set("pdf", f"pdf-of-{ctx.data.get(doc_key)}")
    return {"chain_id": ctx.chain_id, "isolation": ctx.data.isolation.value,
            "sees": ctx.data.to_dict()}


@app.task
@contained(isolation="isolated")
def index_search(doc_key: str) -> dict[str, Any]:
    """Step "Index Search": another isolated branch."""
    ctx = _here()
    ctx.data.update({"indexed": True, "k": "from-index"})
    return {"chain_id": ctx.chain_id, "isolation": ctx.data.isolation.value,
            "sees": ctx.data.to_dict()}


@app.task
@contained()
def consolidate(results: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """The chord callback: merge every branch into the parent they share with it."""
    ctx = _here()
    assert ctx.parent is not None
    merges = merge_children(ctx.parent, [r["chain_id"] for r in results], policy)
    return {cid: list(m.changed) for cid, m in merges.items()}
