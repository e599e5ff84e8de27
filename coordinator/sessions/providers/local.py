"""LocalKernelProvider: a Jupyter kernel per session on this host (jupyter_client +
ipykernel), so a variable defined in one execution is there in the next.

Isolation is best effort: each kernel runs in its own working directory with an
environment built from scratch (PATH, locale, the session's labels; nothing of this
process's secrets) and proxies pointed at a closed port. It is not a security boundary:
use E2B for untrusted code. Processes on the same host reach a kernel through its 0600
connection file; a process on another host is told where the sandbox lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SandboxElsewhereError, SandboxLostError, UnsupportedLanguageError
from ..models import Language
from .base import OutputBuffer, RunOutput, SandboxInfo

T = TypeVar("T")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
INTERRUPT_GRACE_S = 5.0
"""How long an interrupted kernel may take to come back idle before it counts as lost."""
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")


_UNSHARE = ["unshare", "--user", "--map-root-user", "--net"]


def network_isolation_available() -> bool:
    """Whether a process can be started here without network (a new user and network
    namespace: Linux with unprivileged user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=5
                              ).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _pid_alive(pid: int, connection_file: str) -> bool:
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


class _Worker:
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
                 worker: _Worker) -> None:
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
        return _pid_alive(self._pid, self._info.connection["connection_file"])

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


class LocalKernelProvider:
    """Jupyter kernels on this host, one per session, under ``root`` (default: a
    per-user folder in the temp directory). ``host_id`` names this host in records
    (default: the host name). ``isolate_network``: start kernels in a namespace without
    network (None: when the platform allows it; True: required)."""

    name = "local"
    languages: tuple[Language, ...] = ("python",)

    def __init__(self, root: Path | str | None = None, *, host_id: str | None = None,
                 kernel_name: str = "python3", startup_timeout_s: float = 60.0,
                 isolate_network: bool | None = None) -> None:
        self.root = Path(root) if root is not None else (
            Path(tempfile.gettempdir()) / f"budget-sessions-{os.getuid()}")
        self.host_id = host_id or socket.gethostname()
        self.kernel_name = kernel_name
        self.startup_timeout_s = startup_timeout_s
        available = network_isolation_available() if isolate_network is not False else False
        if isolate_network and not available:
            raise RuntimeError("isolate_network=True, but this platform cannot start a "
                               "process without network (unshare --user --net failed)")
        self.isolate_network = available
        self._open: dict[str, KernelSandbox] = {}
        self._lock = threading.Lock()

    def _env(self, workdir: Path, labels: Mapping[str, str]) -> dict[str, str]:
        env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
        closed = "http://127.0.0.1:9"  # the discard port: plain HTTP(S) clients fail fast
        env.update({"HOME": str(workdir), "TMPDIR": str(workdir), "PYTHONUNBUFFERED": "1",
                    "PYTHONNOUSERSITE": "1", "MPLBACKEND": "Agg", "HTTP_PROXY": closed,
                    "HTTPS_PROXY": closed, "http_proxy": closed, "https_proxy": closed,
                    "NO_PROXY": "", "no_proxy": ""})
        env.update({k.upper(): v for k, v in labels.items()})
        return env

    def create(self, labels: Mapping[str, str], *, timeout_s: float, ttl_s: float,
               template: str) -> KernelSandbox:
        sandbox_id = f"local-{secrets.token_hex(8)}"
        folder = self.root / sandbox_id
        workdir = folder / "work"
        workdir.mkdir(parents=True, mode=0o700)
        os.chmod(self.root, 0o700)
        conn_file = str(folder / "kernel.json")
        worker = _Worker(sandbox_id)
        try:
            km, kc = worker.call(lambda: self._start(folder, workdir, conn_file, labels,
                                                     timeout_s))
        except BaseException:
            worker.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        pid = km.provisioner.process.pid
        info = SandboxInfo(sandbox_id, self.host_id, {
            "connection_file": conn_file, "pid": str(pid), "workdir": str(workdir)})
        sandbox = KernelSandbox(info, kc, km, worker)
        with self._lock:
            self._open[sandbox_id] = sandbox
        return sandbox

    def _start(self, folder: Path, workdir: Path, conn_file: str, labels: Mapping[str, str],
               timeout_s: float) -> tuple[Any, Any]:
        from jupyter_client.manager import KernelManager

        # IPC (unix sockets in the 0700 folder), not TCP: no port on any interface.
        km = KernelManager(kernel_name=self.kernel_name, connection_file=conn_file,
                           transport="ipc", ip=str(folder / "ipc"))
        if self.isolate_network:  # unshare execs the kernel: the pid stays the kernel's
            spec = km.kernel_spec
            assert spec is not None
            argv = [sys.executable if a == "python" else a for a in spec.argv]
            spec.argv = [*_UNSHARE, *argv]
        try:
            km.start_kernel(cwd=str(workdir), env=self._env(workdir, labels))
            os.chmod(conn_file, 0o600)
            kc = km.blocking_client()
            kc.start_channels()
            kc.wait_for_ready(timeout=min(timeout_s, self.startup_timeout_s))
        except BaseException:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
            raise
        return km, kc

    def connect(self, info: SandboxInfo) -> KernelSandbox:
        if info.host != self.host_id:
            raise SandboxElsewhereError(info.sandbox_id, info.host, self.host_id)
        with self._lock:
            known = self._open.get(info.sandbox_id)
        if known is not None:
            if known.alive():
                return known
            self._forget(info.sandbox_id, kill=True)
            raise SandboxLostError(info.sandbox_id, "the kernel process is gone")
        conn_file = info.connection.get("connection_file", "")
        pid = info.connection.get("pid", "")
        if not (conn_file and pid.isdigit() and Path(conn_file).is_file()
                and _pid_alive(int(pid), conn_file)):
            raise SandboxLostError(info.sandbox_id, "the kernel process is gone")
        worker = _Worker(info.sandbox_id)

        def join() -> Any:
            from jupyter_client.blocking.client import BlockingKernelClient

            kc = BlockingKernelClient(connection_file=conn_file)
            kc.load_connection_file()
            kc.start_channels()
            try:
                kc.wait_for_ready(timeout=self.startup_timeout_s)
            except RuntimeError:
                kc.stop_channels()
                raise
            return kc

        try:
            kc = worker.call(join)
        except RuntimeError as exc:
            worker.close()
            raise SandboxLostError(info.sandbox_id, f"the kernel does not answer: {exc}"
                                   ) from exc
        sandbox = KernelSandbox(info, kc, None, worker)
        with self._lock:
            self._open[info.sandbox_id] = sandbox
        return sandbox

    def kill(self, info: SandboxInfo) -> bool:
        if info.host != self.host_id:
            raise SandboxElsewhereError(info.sandbox_id, info.host, self.host_id)
        with self._lock:
            known = self._open.get(info.sandbox_id)
        alive = False
        if known is not None:
            alive = known.alive()
            self._forget(info.sandbox_id, kill=True)
        else:
            conn_file = info.connection.get("connection_file", "")
            pid = info.connection.get("pid", "")
            if pid.isdigit() and _pid_alive(int(pid), conn_file):
                alive = True
                os.kill(int(pid), signal.SIGKILL)
        folder = self.root / info.sandbox_id
        if folder.is_dir() and folder.parent == self.root:
            shutil.rmtree(folder, ignore_errors=True)
        return alive

    def _forget(self, sandbox_id: str, *, kill: bool) -> None:
        with self._lock:
            sandbox = self._open.pop(sandbox_id, None)
        if sandbox is not None:
            sandbox.close(kill=kill)

    def close(self) -> None:
        """Kill the kernels this process started (and remove their folders); disconnect
        from other processes'."""
        with self._lock:
            ids = list(self._open)
        for sandbox_id in ids:
            with self._lock:
                sandbox = self._open.pop(sandbox_id, None)
            if sandbox is not None and sandbox._manager is not None:
                sandbox.close(kill=True)
                shutil.rmtree(self.root / sandbox_id, ignore_errors=True)
            elif sandbox is not None:
                sandbox.close(kill=False)
