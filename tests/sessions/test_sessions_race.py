"""Concurrency of session creation, proved with OS processes and real kernels: the tenant
cap holds under a race, and one identity gets one sandbox however many ask at once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from coordinator import Coordinator
from coordinator.sessions import (
    ExecutionSessionIdentity,
    LocalKernelProvider,
    SessionConfig,
    SessionManager,
    SessionStore,
    TooManySessionsError,
)
from tests.support.procs import TEST_KEYS

SPAWN = mp.get_context("spawn")


def _racer(url: str, root: str, path_id: str, cap: int, go: Any, out: Any, done: Any,
           run: Any = None) -> None:
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS)
    manager = SessionManager(coord, LocalKernelProvider(root),
                             SessionConfig(max_sessions_per_tenant=cap))
    identity = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1",
                                        path_id=path_id)
    go.wait()
    try:
        session = manager.get_or_create(identity)
        out.put(("ok", session.sandbox_id))
    except TooManySessionsError as exc:
        out.put(("cap", str(exc)))
    if run is not None:  # then all run code in the one session, from their processes
        run.wait(60)
        result = manager.execute_code(identity, "hits = globals().get('hits', 0) + 1")
        out.put(("ran", str(result.success)))
    done.wait(60)  # keep our kernel (if any) alive until every racer has answered
    manager.close()
    coord.close()


def _race(url: str, root: Path, path_ids: list[str], cap: int
          ) -> tuple[list[tuple[str, str]], int, int]:
    """Each racer's answer, and how many sandbox folders and active sessions existed once
    all had answered (before the racers close: closing ends their sessions)."""
    go, done, out = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_racer, args=(url, str(root), p, cap, go, out, done))
             for p in path_ids]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    made = len([d for d in root.iterdir() if d.is_dir()]) if root.exists() else 0
    reader = Coordinator.from_url(url, token_keys=TEST_KEYS)
    active = len(SessionStore.for_coordinator(reader).list_active_for_tenant("acme"))
    reader.client.close()
    done.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results, made, active


@pytest.mark.slow
def test_twenty_processes_race_for_a_cap_of_three(coord: Coordinator, redis_url: str,
                                                  short_tmp: Path) -> None:
    results, made, active = _race(redis_url, short_tmp / "k",
                                  [f"path-{i}" for i in range(20)], cap=3)
    kinds = [kind for kind, _ in results]
    assert kinds.count("ok") == 3 and kinds.count("cap") == 17
    assert all("Too many active analysis sessions" in msg
               for kind, msg in results if kind == "cap")
    assert active == 3
    store = SessionStore(coord.client, prefix=coord.keyspace.prefix)
    assert store.list_active_for_tenant("acme") == []  # each racer's close ended its own
    # Exactly three sandboxes were ever made: refused racers created nothing.
    assert made == 3
    assert coord.client.zcard("bc:{sess:acme}:claims") == 0  # no claim left behind


def test_one_identity_asked_by_six_processes_gets_one_sandbox(
        coord: Coordinator, redis_url: str, short_tmp: Path) -> None:
    root = short_tmp / "k"
    go, run, done, out = SPAWN.Event(), SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=_racer,
                           args=(redis_url, str(root), "main", 10, go, out, done, run))
             for _ in range(6)]
    for p in procs:
        p.start()
    go.set()
    try:
        results = [out.get(timeout=120) for _ in procs]
        assert {kind for kind, _ in results} == {"ok"}
        assert len({sandbox for _, sandbox in results}) == 1
        assert len([d for d in root.iterdir() if d.is_dir()]) == 1
        # Every process (one created the kernel, five reach it through its connection
        # file on this host) runs code in the same session: the state is shared.
        run.set()
        assert [out.get(timeout=120) for _ in procs] == [("ran", "True")] * 6
        here = SessionManager(coord, LocalKernelProvider(root))
        identity = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c1",
                                            path_id="main")
        assert here.execute_code(identity, "print(hits)").output.strip() == "6"
        session = here.store.load(identity)
        assert session is not None and session.execution_count == 7
        assert len(here.store.list_active_for_tenant("acme")) == 1
        here.close()
    finally:
        done.set()
        for p in procs:
            p.join(30)
    assert all(p.exitcode == 0 for p in procs)
