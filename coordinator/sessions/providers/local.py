"""LocalKernelProvider: a Jupyter kernel per session on this host (jupyter_client +
ipykernel), so a variable defined in one execution is there in the next.

Isolation is best effort: each kernel runs in its own 0700 folder (working directory and
HOME), with an environment built from scratch (PATH, locale, the session's labels; none
of this process's secrets), ZeroMQ over IPC sockets in that folder (no TCP port), and no
network where a user + network namespace can be made (``unshare``); elsewhere proxies
point at a closed port. It is not a security boundary: use E2B for untrusted code.
Processes on the same host reach a kernel through its 0600 connection file; a process on
another host is told where the sandbox lives.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.session_errors import SandboxElsewhereError, SandboxLostError
from ...core.session_models import Language
from ._kernel import KernelSandbox, Worker, pid_alive
from .base import SandboxInfo

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
        worker = Worker(sandbox_id)
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
                and pid_alive(int(pid), conn_file)):
            raise SandboxLostError(info.sandbox_id, "the kernel process is gone")
        worker = Worker(info.sandbox_id)

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

    def alive(self, info: SandboxInfo) -> bool | None:
        """Whether the session's kernel still runs (None: it lives on another host)."""
        if info.host != self.host_id:
            return None
        with self._lock:
            known = self._open.get(info.sandbox_id)
        if known is not None:
            return known.alive()
        conn_file = info.connection.get("connection_file", "")
        pid = info.connection.get("pid", "")
        return bool(conn_file and pid.isdigit() and Path(conn_file).is_file()
                    and pid_alive(int(pid), conn_file))

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
            if pid.isdigit() and pid_alive(int(pid), conn_file):
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
