"""``budgetctl`` run in the test's process, as an operator would run it."""

from __future__ import annotations

import pytest

from coordinator import Coordinator
from coordinator.cli import main


def budgetctl(capsys: pytest.CaptureFixture[str], redis_url: str,
              *args: str) -> tuple[int, str, str]:
    """Run ``budgetctl --redis redis_url *args``: its exit code, stdout and stderr.
    budgetctl reads through a connection of its own, so the settles this process wrote
    behind land first, as they have by the time an operator looks."""
    Coordinator.default().store.flush()
    code = main(["--redis", redis_url, *args])
    out, err = capsys.readouterr()
    return code, out, err
