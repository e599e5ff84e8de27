"""Context data across OS processes: a child in another process reads its parent's data
through its token and isolation level; twenty processes merge into one parent at once;
a checkpoint survives every process being killed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from typing import Any

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from tests.support import data_procs
from tests.support.data_model import apply_merge

SPAWN = mp.get_context("spawn")
CONFIG = ExecutionConfig(max_cost_usd=5.0, max_steps=100, max_retries_total=5)


def _run(target: Any, *args: Any) -> Any:
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=target, args=(*args, out))
    proc.start()
    result = out.get(timeout=120)
    proc.join(30)
    assert proc.exitcode == 0
    return result


def test_child_in_other_process_reads_parent_data(coord: Coordinator, redis_url: str
                                                  ) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.update({"user": {"id": 42}, "cost": 120})
        child = root.spawn_child()
        got = _run(data_procs.read_through, redis_url, child.token, ["user", "cost", "nope"])
        assert got == {"seen": {"user": {"id": 42}, "cost": 120, "nope": "<missing>"},
                       "isolation": "inherit"}
        assert child.data.get("from_worker") == {"pid_seen": True}
        assert "from_worker" not in root.data  # writes are local until merged
        child.merge_into_parent()
        assert root.data.get("from_worker") == {"pid_seen": True}
        child.close()


def test_isolation_levels_across_processes(coord: Coordinator, redis_url: str) -> None:
    with ExecutionContext(CONFIG) as root:
        root.data.set("k", "before")
        isolated = _run(data_procs.spawn_remote, redis_url, root.token, "isolated")
        sandboxed = _run(data_procs.spawn_remote, redis_url, root.token, "sandboxed")
        inherit = _run(data_procs.spawn_remote, redis_url, root.token, "inherit")
        assert isolated["sees"] == {"k": "before"} and sandboxed["sees"] == {}
        root.data.set("k", "after")  # made after the children were created
        seen_iso = _run(data_procs.read_through, redis_url, isolated["token"], ["k"])
        seen_sand = _run(data_procs.read_through, redis_url, sandboxed["token"], ["k"])
        seen_inh = _run(data_procs.read_through, redis_url, inherit["token"], ["k"])
        assert seen_iso == {"seen": {"k": "before"}, "isolation": "isolated"}
        assert seen_sand == {"seen": {"k": "<missing>"}, "isolation": "sandboxed"}
        assert seen_inh == {"seen": {"k": "after"}, "isolation": "inherit"}


@pytest.mark.slow
def test_twenty_processes_merge_into_one_parent(coord: Coordinator, redis_url: str) -> None:
    """Each merge is atomic: the parent ends as if the merges ran one by one in the order
    of their sequence numbers, and each reported exactly the change it made then."""
    initial = {"shared": {"n": 0, "log": ["start"]}, "winner": "parent", "list": [0]}
    policies = ["keep_existing", "overwrite", "merge"]
    with ExecutionContext(CONFIG) as root:
        root.data.update(initial)
        go = SPAWN.Event()
        out = SPAWN.Queue()
        procs = []
        for i in range(20):
            child = root.spawn_child()
            data = {"shared": {"n": i, "log": [f"c{i}"], f"by{i}": True},
                    "winner": f"c{i}", "list": [i], f"own{i}": {"i": i}}
            procs.append(SPAWN.Process(target=data_procs.merge_at_once, args=(
                redis_url, child.token, data, policies[i % 3], go, out)))
        for p in procs:
            p.start()
        go.set()
        results = [out.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        final = root.data.to_dict()
    assert sorted(r["sequence"] for r in results) == list(range(1, 21))
    model = dict(initial)
    for r in sorted(results, key=lambda r: r["sequence"]):
        model, changes = apply_merge(model, r["data"], r["policy"])
        assert changes == {k: r[k] for k in ("added", "overwritten", "merged")}, r
    assert final == model
    assert all(f"own{i}" in final for i in range(20))


def test_checkpoint_survives_killing_every_process(coord: Coordinator, redis_url: str
                                                  ) -> None:
    ready = SPAWN.Queue()
    proc = SPAWN.Process(target=data_procs.checkpoint_then_hang, args=(redis_url, ready))
    proc.start()
    serialized = ready.get(timeout=120)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    got = _run(data_procs.resume_here, redis_url, "kill-test")
    expected = {"plan": "p-7", "cost": 120, "shared": {"a": 1},
                "user": {"id": 42, "email": "u42@example.com"}, "pdf": "pdf-42"}
    assert got["sees"] == expected
    assert got["chain"] == [{"local": {"pdf": "pdf-42"}, "isolation": "isolated"}]
    # the same stack, serialized before the kill, rebuilds the same data here
    again = ExecutionContext.deserialize(serialized, CONFIG)
    assert again.data.to_dict() == expected and again.root_id != got["root"]
    again.close()
