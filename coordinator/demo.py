"""``budgetctl demo``: a fleet of sub-agents as Celery tasks under one budget ceiling.

Scenario 1 fans twelve sub-agents out on two Celery workers under a $0.60 ceiling and
shows the ceiling being reached. Scenario 2 aborts six running sub-agents and shows how
fast the abort reaches them. Everything it starts (redis-server, workers) is stopped at
the end; in a Redis it did not start it leaves only its tree keys, which expire.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any, TextIO

import redis

from .cli import render_tree
from .context.execution import ExecutionContext
from .embedded import RedisServer
from .models import ChainMetadata, ExecutionConfig
from .runtime.coordinator import Coordinator
from .runtime.settings import default_url

ROLES = ["planner", "researcher", "critic", "coder", "tester", "writer",
         "summarizer", "fact-checker", "translator", "reviewer", "analyst", "editor"]


def _answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


@contextlib.contextmanager
def _redis(url: str | None, out: TextIO) -> Iterator[tuple[str, bool]]:
    """A Redis to use: the given or configured one if it answers, else an embedded one
    (stopped on exit). Yields (url, started_here)."""
    candidates = [url] if url else [
        u for u in (os.environ.get("BUDGET_REDIS_URL"), os.environ.get("REDIS_URL"),
                    default_url()) if u]
    for candidate in dict.fromkeys(candidates):
        if _answers(candidate):
            print(f"Redis: {candidate} (shared: only this demo's tree keys are written; "
                  f"they expire)", file=out)
            yield candidate, False
            return
    if url:
        raise SystemExit(f"budgetctl demo: Redis at {url} does not answer")
    with RedisServer() as server:
        print(f"Redis: none answered; started an embedded redis-server at {server.url}",
              file=out)
        yield server.url, True


@contextlib.contextmanager
def _workers(env: dict[str, str], count: int, concurrency: int, log: IO[str]
             ) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "coordinator.demo_tasks", "worker",
                 "-P", "prefork", "-c", str(concurrency), "-n",
                 f"demo{i + 1}-{uuid.uuid4().hex[:6]}@%h", "-Q", env["BUDGET_DEMO_QUEUE"],
                 "-l", "WARNING", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                env={**os.environ, **env}, stdout=log, stderr=log,
                start_new_session=True,  # its pool processes go with it on cleanup
            ))
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class _Progress:
    """One status line, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = 0.0

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + text)
            self.out.flush()
        elif time.monotonic() - self.last >= 1.0:
            self.out.write(text + "\n")
            self.last = time.monotonic()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")


def _bar(used: int, limit: int, width: int = 24) -> str:
    filled = min(width, round(width * used / limit)) if limit else 0
    return "█" * filled + "░" * (width - filled)


def _kids(coord: Coordinator, root: ExecutionContext) -> list[dict[str, str]]:
    return [coord.store.read_hash(root.root_id, cid)
            for cid in coord.store.children(root.root_id, root.chain_id)]


def _refusal(coord: Coordinator, cid: str, at: str) -> str | None:
    """Why a finished sub-agent's call was refused by the ceiling of ``at``, if it was."""
    snap = ExecutionContext.load_snapshot(cid, coord)
    for event in reversed(snap.events):
        if event.decision.value == "HALT" and event.metadata.get("stopped_at") == at:
            return event.reason
    return None


def _watch(coord: Coordinator, root: ExecutionContext, expected: int, out: TextIO,
           timeout_s: float = 90.0) -> list[dict[str, str]]:
    """Show live progress until every sub-agent's context is finished."""
    progress = _Progress(out)
    t0 = time.monotonic()
    announced = False
    seen: set[str] = set()
    kids: list[dict[str, str]] = []
    while time.monotonic() - t0 < timeout_s:
        h = coord.store.read_hash(root.root_id, root.chain_id)
        ids = coord.store.children(root.root_id, root.chain_id)
        kids = [coord.store.read_hash(root.root_id, cid) for cid in ids]
        used, held, limit = (int(h.get(k) or 0) for k in ("u:usd", "h:usd", "l:usd"))
        done = [cid for cid, k in zip(ids, kids, strict=True)
                if k.get("status") in ("closed", "stopped")]
        progress.show(
            f"[{time.monotonic() - t0:5.1f}s] {_bar(used, limit)} ${used / 1e6:.4f} of "
            f"${limit / 1e6:.2f} (+${held / 1e6:.4f} reserved)  agents: "
            f"{len(kids) - len(done)} running, {len(done)} finished, "
            f"{expected - len(kids)} queued")
        if not announced and h.get("status") == "stopped":
            progress.done()
            print(f"  >> orchestrator stopped: {h.get('reason')} ({h.get('detail')}); "
                  f"every further call in the tree is refused", file=out)
            announced = True
        for cid in done:
            if cid in seen or announced:
                continue
            seen.add(cid)
            why = _refusal(coord, cid, root.chain_id)
            if why:
                progress.done()
                print(f"  >> ceiling reached: the orchestrator's ceiling refused a call of "
                      f"sub-agent {cid[:8]} before it ran ({why}, in micro-USD)", file=out)
                announced = True
        if len(kids) == expected and len(done) == expected:
            break
        time.sleep(0.2)
    progress.done()
    return kids


def _orchestrator(coord: Coordinator, max_cost_usd: float) -> ExecutionContext:
    """A fresh root context for one scenario."""
    meta = ChainMetadata(request_id=uuid.uuid4().hex, chain_id=f"demo-{uuid.uuid4().hex[:8]}",
                         service="orchestrator")
    return ExecutionContext(ExecutionConfig(max_cost_usd=max_cost_usd, max_steps=500,
                                            max_retries_total=20),
                            metadata=meta, coordinator=coord)


def _scenario_ceiling(coord: Coordinator, sub_agent: Any, out: TextIO) -> None:
    print("\n== Scenario 1: 12 sub-agents (gpt-4o, cap $0.12 each) under one $0.60 "
          "ceiling, on 2 Celery workers", file=out)
    with _orchestrator(coord, 0.60) as root:
        for role in ROLES:
            sub_agent.delay(role, 6, "gpt-4o", 0.4)
        _watch(coord, root, len(ROLES), out)
        snap = root.get_snapshot()
    print(f"  spent ${snap.cost_usd_accumulated:.6f} of ${snap.max_cost_usd:.2f} in "
          f"{snap.step_count} calls ({snap.tokens.total:,} tokens); reserved now: "
          f"${snap.cost_usd_reserved:.6f}", file=out)
    print("\n" + "\n".join(render_tree(coord, root.chain_id)), file=out)


def _scenario_abort(coord: Coordinator, sub_agent: Any, out: TextIO) -> None:
    print("\n== Scenario 2: abort the orchestrator while 6 sub-agents are mid-call "
          "(claude-sonnet-4, ~1.5 s per call)", file=out)
    with _orchestrator(coord, 5.00) as root:
        for role in ROLES[:6]:
            sub_agent.delay(role, 10, "claude-sonnet-4", 1.5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kids = _kids(coord, root)
            if len(kids) == 6 and all(int(k.get("h:usd") or 0) > 0 for k in kids):
                break
            time.sleep(0.05)
        time.sleep(0.8)
        abort_ms = coord.store.server_time_ms()
        root.abort("operator pressed stop")
        print("  >> abort sent: 'operator pressed stop'", file=out)
        kids = _watch(coord, root, 6, out, timeout_s=30)
        ended = [int(k.get("closed_ms") or k.get("stopped_ms") or 0) for k in kids]
        snap = root.get_snapshot()
    if ended and all(ended):
        print(f"  >> the abort reached all {len(kids)} running sub-agents on 2 workers; "
              f"the last one ended {max(ended) - abort_ms} ms after abort()", file=out)
    print(f"  spent ${snap.cost_usd_accumulated:.6f} (interrupted calls settled once, at "
          f"their estimate); reserved now: ${snap.cost_usd_reserved:.6f}", file=out)
    print("\n" + "\n".join(render_tree(coord, root.chain_id)), file=out)


def _forget_queue(url: str, queue: str) -> None:
    """Drop the broker keys of this demo's queue (Celery leaves its binding behind)."""
    client = redis.Redis.from_url(url)
    try:
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    finally:
        client.close()


def run_demo(redis_url: str | None = None, out: TextIO = sys.stdout) -> int:
    """Run both scenarios; returns the exit code."""
    secret = secrets.token_hex(24)
    queue = f"budgetctl-demo-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        url, embedded = stack.enter_context(_redis(redis_url, out))
        env = {"BUDGET_REDIS_URL": url, "BUDGET_TOKEN_KEYS": f"demo:{secret}",
               "BUDGET_DEMO_BROKER": url, "BUDGET_DEMO_QUEUE": queue}
        os.environ.update(env)  # the client side of coordinator.demo_tasks reads them
        log = stack.enter_context(tempfile.NamedTemporaryFile(
            "w+", prefix="budgetctl-demo-", suffix=".log", delete=False))
        stack.callback(_forget_queue, url, queue)
        # the token key stays in this process and its workers: no dev key lands in Redis
        coord = Coordinator.from_url(url, token_keys={"demo": secret.encode()})
        stack.callback(coord.close)
        from .demo_tasks import app, sub_agent

        stack.callback(app.close)
        stack.enter_context(_workers(env, count=2, concurrency=3, log=log))
        print(f"Workers: 2 Celery workers (prefork, 3 processes each) on queue {queue}; "
              f"their log: {log.name}", file=out)
        _scenario_ceiling(coord, sub_agent, out)
        _scenario_abort(coord, sub_agent, out)
    print("\nDone: workers stopped" + (", embedded Redis stopped." if embedded else
                                        "; this demo's tree keys expire in a week."), file=out)
    os.unlink(log.name)
    return 0
