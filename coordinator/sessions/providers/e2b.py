"""E2BProvider: the provider protocol on E2B sandboxes (``e2b-code-interpreter``, the
``e2b`` extra, imported only when used). Sandboxes are reachable from any host."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...core.session_errors import SandboxLostError
from ...core.session_models import Language
from .base import OutputBuffer, RunOutput, SandboxInfo


def execution_to_output(execution: Any, max_output_chars: int) -> RunOutput:
    """An ``e2b_code_interpreter.Execution`` as a RunOutput: stdout and stderr, then the
    text of each result (JSON for a JSON main result), cut at ``max_output_chars``; an
    error as ``Name: value`` and its traceback."""
    buf = OutputBuffer(max_output_chars)
    out = RunOutput()
    for line in [*execution.logs.stdout, *execution.logs.stderr]:
        buf.add(line)
    for result in execution.results:
        if result.is_main_result and result.json is not None:
            out.json_result = True
            buf.add(json.dumps(result.json) + "\n")
        elif result.text is not None:
            buf.add(result.text + "\n")
    if execution.error is not None:
        err = execution.error
        out.error = f"{err.name}: {err.value}\n{err.traceback}"
        out.interrupted = err.name == "KeyboardInterrupt"
    out.output, out.truncated = buf.text(), buf.truncated
    return out


class E2BSandbox:
    """A connected E2B sandbox."""

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self._info = SandboxInfo(str(sandbox.sandbox_id), "", {
            "sandbox_domain": str(getattr(sandbox, "sandbox_domain", "") or "")})

    @property
    def info(self) -> SandboxInfo:
        return self._info

    def run(self, code: str, language: Language, *, timeout_s: float,
            max_output_chars: int) -> RunOutput:
        from e2b.exceptions import SandboxException, TimeoutException

        try:
            execution = self._sandbox.run_code(code, language=language, timeout=timeout_s)
        except TimeoutException as exc:
            if not self._sandbox.is_running():
                raise SandboxLostError(self._info.sandbox_id, str(exc)) from exc
            return RunOutput(error=f"TimeoutError: execution exceeded {timeout_s:g} s",
                             timed_out=True)
        except SandboxException as exc:
            raise SandboxLostError(self._info.sandbox_id, str(exc)) from exc
        return execution_to_output(execution, max_output_chars)

    def interrupt(self) -> None:
        """E2B has no interrupt of one run in the default code context: the run ends at
        its timeout (and a stopped conversation refuses the next one)."""


class E2BProvider:
    """E2B sandboxes. ``api_key`` defaults to ``E2B_API_KEY``; internet access is off
    unless ``allow_internet_access``."""

    name = "e2b"
    languages: tuple[Language, ...] = ("python", "javascript")

    def __init__(self, *, api_key: str | None = None, allow_internet_access: bool = False
                 ) -> None:
        self._opts: dict[str, Any] = {"api_key": api_key} if api_key else {}
        self.allow_internet_access = allow_internet_access

    def create(self, labels: Mapping[str, str], *, timeout_s: float, ttl_s: float,
               template: str) -> E2BSandbox:
        from e2b_code_interpreter import Sandbox

        sandbox = Sandbox.create(
            template=None if template in ("", "base") else template,
            timeout=max(1, int(ttl_s)), metadata=dict(labels),
            envs={k.upper(): v for k, v in labels.items()},
            allow_internet_access=self.allow_internet_access,
            request_timeout=timeout_s, **self._opts)
        return E2BSandbox(sandbox)

    def connect(self, info: SandboxInfo) -> E2BSandbox:
        from e2b.exceptions import NotFoundException, SandboxException
        from e2b_code_interpreter import Sandbox

        try:
            return E2BSandbox(Sandbox.connect(info.sandbox_id, **self._opts))
        except (NotFoundException, SandboxException) as exc:
            raise SandboxLostError(info.sandbox_id, str(exc)) from exc

    def kill(self, info: SandboxInfo) -> bool:
        from e2b_code_interpreter import Sandbox

        return bool(Sandbox.kill(info.sandbox_id, **self._opts))
