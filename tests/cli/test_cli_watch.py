"""``budgetctl top --watch`` and ``tree --watch`` in real processes: frames are redrawn
with what changed in Redis, and Ctrl-C ends them cleanly (exit 0)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator import Coordinator, ExecutionConfig, ExecutionContext, report_usage

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONWARNINGS": "ignore"}


def _read_until(fd: int, text: bytes, count: int, timeout_s: float = 120.0) -> bytes:
    """What ``fd`` gave until ``text`` appeared ``count`` times (the deadline leaves room
    for a Python process to start on a loaded CI machine, which can take tens of seconds)."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while got.count(text) < count:
        assert time.monotonic() < deadline, got.decode(errors="replace")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty closed: the process ended
                break
            if not chunk:
                break
            got += chunk
    return got


def test_top_watch_redraws_on_a_terminal_and_ctrl_c_exits_cleanly(
        coord: Coordinator, redis_url: str) -> None:
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5, max_retries_total=1))
    main_fd, tty_fd = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "top", "--watch", "0.2", "--redis",
         redis_url], stdin=tty_fd, stdout=tty_fd, stderr=tty_fd, env=ENV, cwd=ROOT)
    os.close(tty_fd)
    try:
        header = b"budgetctl top \xc2\xb7 every 0.2s"
        # a frame is written in several chunks: it is whole once the next one begins
        first = _read_until(main_fd, header, 2).split(header)[1]
        assert run.chain_id.encode() in first and b"$0.0000" in first
        run.wrap_llm_call(lambda: report_usage(cost_usd=0.25))
        later = _read_until(main_fd, b"$0.2500", 1)  # a later frame shows the spend
        assert b"budgetctl top \xc2\xb7 every 0.2s" in later
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        rest = _read_until(main_fd, b"\n", 0, timeout_s=1)
        assert b"Traceback" not in first + later + rest and b"Aborted" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
        run.close()


def test_tree_watch_piped_prints_frame_after_frame(coord: Coordinator, redis_url: str) -> None:
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5, max_retries_total=1))
    child = run.spawn_child(max_cost_usd=0.5)
    with subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "--redis", redis_url, "tree",
         run.chain_id, "--watch", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            fd = proc.stdout.fileno()
            first = _read_until(fd, b"Ctrl-C to stop", 2).split(b"Ctrl-C to stop")[1]
            assert child.chain_id.encode() in first
            run.abort("watch me")
            later = _read_until(fd, b"watch me", 2)  # on the root and on the child
            assert f"halted: aborted at {run.chain_id} (watch me)".encode() in later
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
            assert b"Traceback" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
            run.close()


def test_top_json_watch_prints_one_document_per_line(coord: Coordinator,
                                                    redis_url: str) -> None:
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5, max_retries_total=1))
    with subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "--redis", redis_url, "top", "--json",
         "--watch", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None
            first, second = proc.stdout.readline(), proc.stdout.readline()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(15) == 0
            for line in (first, second):
                doc = json.loads(line)
                assert doc["total"] == 1 and doc["trees"][0]["id"] == run.chain_id
        finally:
            if proc.poll() is None:
                proc.kill()
            run.close()
