"""``budgetctl dashboard`` and ``budgetctl alerts`` as an operator runs them: a public
address without credentials refused (exit 2, the reason said), the dashboard served on
the port given, the indexer alone keeping the indexes until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.embedded import free_port
from tests.support.dashboard_server import Http, coordinator, open_tree, spend
from tests.support.procs import TEST_KEYS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items()
          if k not in ("BUDGET_DASHBOARD_USERS", "BUDGET_DASHBOARD_TOKENS")},
       "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore",
       "BUDGET_TOKEN_KEYS": "test:" + TEST_KEYS["test"].decode(),
       "BUDGET_DASHBOARD_SWEEP_S": "1"}


def _wait(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if value := check():
                return value
        except OSError:  # not listening yet
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_public_address_without_credentials_exits_2_with_the_reason(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("BUDGET_DASHBOARD_USERS", raising=False)
    monkeypatch.delenv("BUDGET_DASHBOARD_TOKENS", raising=False)
    code = main(["dashboard", "--host", "0.0.0.0", "--port", "1", "--redis",
                 "redis://127.0.0.1:1/0"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("budgetctl: dashboard: refusing to serve on 0.0.0.0")
    assert "BUDGET_DASHBOARD_USERS" in err and "Traceback" not in err


def test_without_the_dashboard_extra_it_exits_2_naming_the_extra() -> None:
    # starlette made unimportable, as in an install without the 'dashboard' extra
    code = ("import sys; sys.modules['starlette'] = None; from coordinator.cli import main; "
            "sys.exit(main(['dashboard']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=ENV,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().startswith(
        "budgetctl: the dashboard needs the 'dashboard' extra (pip install "
        "'budget-coordinator[dashboard]')")


def test_both_commands_are_listed_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert " dashboard " in out and " alerts " in out


def test_dashboard_serves_on_the_port_given_until_terminated(redis_url: str) -> None:
    port = free_port()
    with subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli", "dashboard", "--port", str(port),
             "--redis", redis_url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT) as proc:
        try:
            http = Http(f"http://127.0.0.1:{port}")
            status, _, body = _wait(lambda: proc.poll() is None
                                    and (r := http.request("GET", "/healthz"))[0] == 200 and r)
            assert json.loads(body) == {"ok": True, "redis": True, "listener": True,
                                        "indexers": {"": True}}
            proc.terminate()
            # uvicorn shuts down gracefully, then re-raises the signal it caught
            assert proc.wait(15) == -signal.SIGTERM
            assert proc.stdout is not None
            log = proc.stdout.read()
            assert b"Finished server process" in log and b"Traceback" not in log
        finally:
            if proc.poll() is None:
                proc.kill()


def test_alerts_keeps_the_indexes_until_ctrl_c(redis_url: str) -> None:
    coord = coordinator(redis_url)
    root = open_tree(coord, "indexed-by-alerts")
    spend(root, 0.25)
    coord.store.flush()
    index = coord.keyspace.dash_index("spend", "all")
    with subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli", "--redis", redis_url, "alerts"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT) as proc:
        try:
            score = _wait(lambda: coord.client.zscore(index, "indexed-by-alerts"))
            assert score == pytest.approx(0.25)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
            assert proc.stdout is not None
            assert b"Traceback" not in proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
            root.close()
            coord.close()
