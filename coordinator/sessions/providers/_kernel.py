"""A Jupyter kernel seen from this process: its run loop (output, errors, timeout,
interrupt) and the one thread that does its jupyter_client I/O."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ...core.session_errors import SandboxLostError, UnsupportedLanguageError
from ...core.session_models import Language
from .base import OutputBuffer, RunOutput, SandboxInfo

T = TypeVar("T")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
INTERRUPT_GRACE_S = 5.0
"""How long an interrupted kernel may take to come back idle before it counts as lost."""


def pid_alive(pid: int, connection_file: str) -> bool:
    """Whether ``pid`` runs, and (where /proc tells) is the kernel of that file: a
    recycled pid is not mistaken for the kernel."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        raw = cmdline.read_bytes()
    except OSError:
        return True  # no /proc: trust the signal probe
    if not raw:
        return False  # a zombie
    return connection_file.encode() in raw


class Worker:
    """One thread that does all of a kernel's jupyter_client I/O. jupyter_client's
    blocking API runs an asyncio loop per calling thread and never closes it; one thread
    per kernel, whose loop is closed with it, keeps that bounded and tidy."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def call(self, fn: Callable[[], T]) -> T:
        return self._pool.submit(fn).result()

    def close(self) -> None:
        def close_loop() -> None:
            from jupyter_core.utils import ensure_event_loop

            loop = ensure_event_loop()  # the one this thread's jupyter calls used
            if not loop.is_running():
                loop.close()
        with contextlib.suppress(RuntimeError):
            self._pool.submit(close_loop).result()
        self._pool.shutdown(wait=True)


class KernelSandbox:
    """One kernel, connected from this process."""

    def __init__(self, info: SandboxInfo, client: Any, manager: Any | None,
                 worker: Worker) -> None:
        self._info = info
        self._client = client
        self._manager = manager  # set when this process started the kernel
        self._worker = worker
        self._pid = int(info.connection["pid"])
        self._interrupted = False

    @property
    def info(self) -> SandboxInfo:
        return self._info

    def alive(self) -> bool:
        return pid_alive(self._pid, self._info.connection["connection_file"])

    def interrupt(self) -> None:
        """SIGINT to the kernel: the running cell raises KeyboardInterrupt."""
        self._interrupted = True
        try:
            os.kill(self._pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def run(self, code: str, language: Language, *, timeout_s: float,
            max_output_chars: int) -> RunOutput:
        if language != "python":
            raise UnsupportedLanguageError(language, "local")
        return self._worker.call(lambda: self._run(code, timeout_s, max_output_chars))

    def _run(self, code: str, timeout_s: float, max_chars: int) -> RunOutput:
        self._interrupted = False
        kc = self._client
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        buf = OutputBuffer(max_chars)
        out = RunOutput()
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if out.timed_out:  # the grace after our interrupt ran out too
                    raise SandboxLostError(self._info.sandbox_id,
                                           "the kernel did not come back after an interrupt")
                out.timed_out = True
                self.interrupt()
                deadline = time.monotonic() + INTERRUPT_GRACE_S
                continue
            try:
                msg = kc.get_iopub_msg(timeout=min(left, 0.25))
            except queue.Empty:
                if not self.alive():
                    raise SandboxLostError(self._info.sandbox_id,
                                           "the kernel died during the run") from None
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                buf.add(content.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                data = content.get("data", {})
                if kind == "execute_result" and "application/json" in data:
                    out.json_result = True
                    buf.add(json.dumps(data["application/json"]) + "\n")
                else:
                    buf.add(str(data.get("text/plain", "")) + "\n")
            elif kind == "error":
                trace = _ANSI.sub("", "\n".join(content.get("traceback", [])))
                out.error = f"{content.get('ename')}: {content.get('evalue')}\n{trace}"
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        self._drain_shell()
        out.interrupted = self._interrupted and not out.timed_out
        out.output, out.truncated = buf.text(), buf.truncated
        return out

    def _drain_shell(self) -> None:
        try:
            while True:
                self._client.get_shell_msg(timeout=0.01)
        except queue.Empty:
            pass

    def close(self, *, kill: bool) -> None:
        def stop() -> None:
            try:
                self._client.stop_channels()
            finally:
                if kill and self._manager is not None:
                    self._manager.shutdown_kernel(now=True)
        try:
            self._worker.call(stop)
        finally:
            self._worker.close()
            if kill and self._manager is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGKILL)
