"""Every code block of README.md and docs/*.md runs as written, page by page, as a reader
would type them: in a fresh folder, against a redis-server of the test's own named by
``BUDGET_REDIS_URL`` (Celery's broker and result backend by ``CELERY_BROKER_URL`` and
``CELERY_RESULT_BACKEND``, which the pages name).

- A ``python`` block whose first line is a comment naming a file (``# agents.py: ...``) is
  that file: it is written into the folder. Every other ``python`` block is typed, line by
  line, into one interactive console per page (``tests/support/doc_console.py``), in page order,
  so a block sees the names the blocks above it defined; none may show a traceback.
- A ``bash`` block's commands run in the folder, in page order, between the Python blocks
  around them; each must exit 0. A command that serves (``celery ... worker``,
  ``budgetctl dashboard``) is started in the background and waited for until it is ready;
  it is stopped when the page ends.
- ``json`` blocks parse. Blocks without a language are output or diagrams, not run.
- What is not run here is listed below with the reason (``NOT_RUN``), and every entry must
  still match a block, so the list cannot go stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator.embedded import RedisServer
from tests.support.doc_pages import PAGES, Page, blocks_of, page_env

# (page, a piece of the block or command) -> why it is not run here.
NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "./dev demo"): "sets up .venv and runs the demo: tests/celery/test_celery_cli.py "
                                 "runs `budgetctl demo`",
    ("README.md", "./dev test"): "runs the whole test suite, this test included",
    ("README.md", "budgetctl tree <id>"): "a synopsis' placeholder: tests/cli/test_cli.py",
    ("README.md", "budgetctl abort <id> [reason]"): "a synopsis' placeholders: "
                                                    "tests/cli/test_cli_first_steps.py",
    ("README.md", "budgetctl repair <id>"): "a synopsis' placeholder: tests/store/test_repair.py",
    ("README.md", "budgetctl spend [--day"): "a synopsis' optional part: tests/cli/test_cli.py",
    ("docs/tokens.md", "deploy/update_price_table.py"):
        "downloads the litellm wheel from PyPI (or reads a copy of LiteLLM's map) and "
        "rewrites the price table shipped in the package",
    ("docs/tokens.md", "client.chat.completions.create("): "calls OpenAI (a key, the "
        "network); the same metering runs in the page's last block, on a recorded stream",
    ("docs/topology.md", "redis+sentinel://s1:26379"): "names the hosts of a deployment "
        "(s1, n1, ...); tests/faults/test_topologies.py connects each URL form to real Sentinel "
        "and Cluster servers",
    ("docs/dashboard.md", "pip install"): "installs from PyPI; the test environment has "
                                          "every extra",
    ("docs/dashboard.md", "Bearer $"): "needs tokens in BUDGET_DASHBOARD_TOKENS and trees of "
        "those names; tests/dashboard/test_dashboard_api.py makes these calls",
    ("docs/dashboard.md", "bench/"): "a benchmark (minutes): `./dev bench` runs it",
    ("docs/topology.md", "bench/nemesis.py"): "the nemesis' long form (hours): "
                                              "tests/faults/test_nemesis.py runs its short form",
}


def not_run_reason(page: str, text: str) -> str | None:
    return next((why for (p, piece), why in NOT_RUN.items()
                 if p == page and piece in text), None)


@pytest.fixture(scope="module")
def docs_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page: str, docs_redis: RedisServer, tmp_path: Path) -> None:
    client = redis.Redis.from_url(docs_redis.url)
    client.flushall()
    client.close()
    runner = Page(page, tmp_path, page_env(docs_redis, tmp_path))
    try:
        runner.run_blocks(lambda text: not_run_reason(page, text))
    finally:
        runner.close()


def test_every_not_run_entry_names_a_block() -> None:
    texts = {page: [b.text for b in blocks_of(page)] for page in PAGES}
    for page, piece in NOT_RUN:
        assert any(piece in t for t in texts[page]), (page, piece)
