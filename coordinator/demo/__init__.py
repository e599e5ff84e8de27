"""``budgetctl demo``: a fleet of sub-agents as Celery tasks under one budget ceiling.

Scenario 1 fans twelve sub-agents out on two Celery workers under a $0.60 ceiling and
shows the ceiling being reached. Scenario 2 aborts six running sub-agents and shows how
fast the abort reaches them. Everything it starts (redis-server, workers) is stopped at
the end; in a Redis it did not start it leaves only its tree keys, which expire.

The core never imports this package (it needs Celery); budgetctl imports it when the
`demo` command runs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
import uuid
from typing import TextIO

from ..runtime.coordinator import Coordinator
from .infra import choose_redis, forget_queue, workers
from .scenarios import ShowTree, scenario_abort, scenario_ceiling

__all__ = ["run_demo"]


def run_demo(redis_url: str | None, show_tree: ShowTree, out: TextIO = sys.stdout) -> int:
    """Run both scenarios on ``redis_url`` (None: the configured Redis if it answers,
    else an embedded one), printing each tree with ``show_tree``; returns the exit code."""
    secret = secrets.token_hex(24)
    queue = f"budgetctl-demo-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        url, embedded = stack.enter_context(choose_redis(redis_url, out))
        env = {"BUDGET_REDIS_URL": url, "BUDGET_TOKEN_KEYS": f"demo:{secret}",
               "BUDGET_DEMO_BROKER": url, "BUDGET_DEMO_QUEUE": queue}
        os.environ.update(env)  # the client side of coordinator.demo.tasks reads them
        log = stack.enter_context(tempfile.NamedTemporaryFile(
            "w+", prefix="budgetctl-demo-", suffix=".log", delete=False))
        stack.callback(forget_queue, url, queue)
        # the token key stays in this process and its workers: no dev key lands in Redis
        coord = Coordinator.from_url(url, token_keys={"demo": secret.encode()})
        stack.callback(coord.close)
        from .tasks import app, sub_agent

        stack.callback(app.close)
        stack.enter_context(workers(env, count=2, concurrency=3, log=log))
        print(f"Workers: 2 Celery workers (prefork, 3 processes each) on queue {queue}; "
              f"their log: {log.name}", file=out)
        scenario_ceiling(coord, sub_agent, out, show_tree)
        scenario_abort(coord, sub_agent, out, show_tree)
    print("\nDone: workers stopped" + (", embedded Redis stopped." if embedded else
                                        "; this demo's tree keys expire in a week."), file=out)
    os.unlink(log.name)
    return 0
