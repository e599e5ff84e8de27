"""Where the demo runs: a Redis (the configured one if it answers, else an embedded
one), Celery workers in their own sessions, and the cleanup of its broker queue."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import IO, TextIO

import redis

from ..embedded import RedisServer
from ..errors import BackendUnavailableError, BudgetCoordinatorError
from ..runtime.settings import default_url
from ..store.connection import connect


def answers(url: str) -> bool:
    """Whether a Redis answers PING at ``url`` (any topology). A URL that cannot work
    raises TopologyURLError, a misconfigured Redis BackendConfigError."""
    try:
        client = connect(url, socket_timeout=0.5, connect_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


@contextlib.contextmanager
def choose_redis(url: str | None, out: TextIO) -> Iterator[tuple[str, bool]]:
    """A Redis to use: the given or configured one if it answers, else an embedded one
    (stopped on exit). Yields (url, started_here). A ``url`` given that cannot work or
    does not answer raises (TopologyURLError, BackendConfigError,
    BackendUnavailableError)."""
    candidates = [url] if url else [
        u for u in (os.environ.get("BUDGET_REDIS_URL"), os.environ.get("REDIS_URL"),
                    default_url()) if u]
    for candidate in dict.fromkeys(candidates):
        try:
            answered = answers(candidate)
        except BudgetCoordinatorError:
            if url:
                raise
            answered = False  # a configured URL that cannot work: the embedded one instead
        if answered:
            print(f"Redis: {candidate} (shared: only this demo's tree keys are written; "
                  f"they expire)", file=out)
            yield candidate, False
            return
    if url:
        raise BackendUnavailableError("the demo", ConnectionError("no answer to PING"))
    with RedisServer() as server:
        print(f"Redis: none answered; started an embedded redis-server at {server.url}",
              file=out)
        yield server.url, True


@contextlib.contextmanager
def workers(env: dict[str, str], count: int, concurrency: int, log: IO[str]
             ) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "coordinator.demo.tasks", "worker",
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


def forget_queue(url: str, queue: str) -> None:
    """Drop the broker keys of this demo's queue (Celery leaves its binding behind)."""
    client = redis.Redis.from_url(url)
    try:
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    finally:
        client.close()
