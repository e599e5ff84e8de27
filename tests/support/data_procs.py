"""Bodies of the OS processes that the context-data tests start (multiprocessing, spawn)."""

from __future__ import annotations

import time
from typing import Any

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from tests.support.procs import TEST_KEYS

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=5)


def _coord(url: str) -> Coordinator:
    return Coordinator.from_url(url, token_keys=TEST_KEYS)


def read_through(url: str, token: str, keys: list[str], out: Any) -> None:
    """Attach to a context and report what it sees of ``keys`` and its own write."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    seen = {k: ctx.data.get(k, "<missing>") for k in keys}
    ctx.data.set("from_worker", {"pid_seen": True})
    out.put({"seen": seen, "isolation": ctx.data.isolation.value})
    coord.close()


def spawn_remote(url: str, token: str, isolation: str, out: Any) -> None:
    """Open a child of ``token``'s context here, with ``isolation``; report its token."""
    coord = _coord(url)
    child = ExecutionContext.spawn_from_token(token, coordinator=coord, isolation=isolation)
    out.put({"token": child.token, "sees": child.data.to_dict()})
    coord.close()


def merge_at_once(url: str, token: str, child_data: dict[str, Any], policy: str,
                  go: Any, out: Any) -> None:
    """Write ``child_data`` into an attached child, wait for the start signal, merge."""
    coord = _coord(url)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ctx.data.update(child_data)
    go.wait(60)
    res = ctx.merge_into_parent(policy)
    out.put({"policy": policy, "data": child_data, "sequence": res.sequence,
             "added": list(res.added), "overwritten": list(res.overwritten),
             "merged": list(res.merged)})
    coord.close()


def checkpoint_then_hang(url: str, ready: Any) -> None:
    """Build a three-level tree with data, checkpoint its leaf, then hang (SIGKILLed)."""
    coord = _coord(url)
    root = ExecutionContext(CONFIG, coordinator=coord)
    root.data.update({"plan": "p-7", "cost": 120, "shared": {"a": 1}})
    step = root.spawn_child(step_name="Fetch User")
    step.data.set("user", {"id": 42, "email": "u42@example.com"})
    branch = step.spawn_child(isolation="isolated", step_name="Render PDF", is_parallel=True)
    root.data.set("cost", 999)  # after the branch froze its view: not in its checkpoint
    branch.data.set("pdf", "pdf-42")
    branch.checkpoint("kill-test")
    ready.put(branch.serialize())
    time.sleep(3600)


def resume_here(url: str, checkpoint_id: str, out: Any) -> None:
    """Resume a checkpoint in this new process and report the data it rebuilt."""
    coord = _coord(url)
    leaf = ExecutionContext.resume(checkpoint_id, CONFIG, coordinator=coord)
    chain = []
    ctx: ExecutionContext | None = leaf
    while ctx is not None:
        chain.append({"local": ctx.data.to_dict(local=True),
                      "isolation": ctx.data.isolation.value})
        ctx = ctx.parent
    out.put({"sees": leaf.data.to_dict(), "chain": chain, "root": leaf.root_id})
    ctx = leaf
    while ctx is not None:
        ctx.close()
        ctx = ctx.parent
    coord.close()
