"""execute_code: one code execution in a path's session, run as a budgeted tool call of
the session's context (steps counted, sandbox time charged, aborts interrupt it)."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from ..context.cancellation import CancellationToken
from ..context.execution import ExecutionContext, current_cancellation_token
from ..context.wrap import run_sync
from ..core.session_errors import (
    ExecutionRefusedError,
    InvalidSessionInputError,
    SandboxLostError,
    UnsupportedLanguageError,
)
from ..core.session_models import (
    CodeExecutionResult,
    ExecutionSession,
    ExecutionSessionIdentity,
    OutputType,
    SessionConfig,
)
from ..core.usage import report_usage
from ..models import Decision, WrapOptions
from ..store.sessions import SessionStore
from .providers.base import RunOutput, Sandbox, SandboxProvider
from .sanitize import OutputSanitizer
from .telemetry import EXECUTE_CODE, SessionMetrics, span

LANGUAGES = ("python", "javascript")
MAX_CODE_CHARS = 1_000_000


class SessionHost(Protocol):
    """What an execution uses of :class:`~coordinator.sessions.SessionManager` (whose
    module imports this one)."""

    @property
    def provider(self) -> SandboxProvider: ...
    @property
    def config(self) -> SessionConfig: ...
    @property
    def store(self) -> SessionStore: ...
    @property
    def sanitizer(self) -> OutputSanitizer: ...
    @property
    def metrics(self) -> SessionMetrics: ...

    def get_or_create(self, identity: ExecutionSessionIdentity,
                      parent: ExecutionContext | None = None) -> ExecutionSession: ...

    def sandbox_for(self, session: ExecutionSession) -> Sandbox: ...

    def budget_for(self, session: ExecutionSession) -> ExecutionContext: ...

    def mark_error(self, session: ExecutionSession, error: str) -> None: ...

    def terminate(self, identity: ExecutionSessionIdentity, reason: str = "manual"
                  ) -> bool: ...


def execute_code(manager: SessionHost, identity: ExecutionSessionIdentity, code: str,
                 language: str, parent: ExecutionContext | None) -> CodeExecutionResult:
    """See :meth:`SessionManager.execute_code`.

    Errors as the specification's table says: the tenant cap and a creation failure
    raise; a lost sandbox (found when connecting) raises SandboxLostError and marks the
    session error (the next call starts a new one); a timeout
    returns an error result and keeps the session; the sandbox failing during the run
    returns an error result and marks the session ``error``; code that raises returns
    an error result and keeps the session (its state is intact); a stopped or exhausted
    budget raises ExecutionRefusedError; Redis failing raises (fail closed)."""
    if language not in LANGUAGES:
        raise InvalidSessionInputError("language", language, f"one of {LANGUAGES}")
    if language not in manager.provider.languages:
        raise UnsupportedLanguageError(language, manager.provider.name)
    if parent is not None and parent.stop_reason is not None:
        # Known stopped here already: refuse before a sandbox is made for nothing.
        raise ExecutionRefusedError(parent.stop_reason, Decision.HALT.value)
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        raise InvalidSessionInputError("code", type(code).__name__,
                                       f"a str of at most {MAX_CODE_CHARS} characters")
    with span(EXECUTE_CODE, identity, **{"code.language": language}) as current:
        result = _execute(manager, identity, code, language, parent)
        current.set_attribute("code.success", result.success)
        return result


def _connect(manager: SessionHost, identity: ExecutionSessionIdentity,
             parent: ExecutionContext | None) -> tuple[ExecutionSession, Sandbox]:
    session = manager.get_or_create(identity, parent)
    try:
        return session, manager.sandbox_for(session)
    except SandboxLostError as exc:
        # Lost between executions: said, not papered over with a fresh sandbox whose
        # state would silently differ. The next call starts a new session.
        manager.metrics.errors.labels(kind="sandbox_lost").inc()
        manager.mark_error(session, manager.sanitizer(str(exc)))
        raise SandboxLostError(session.sandbox_id, f"{exc.why}; the session is marked "
                               "error and the path's next call starts a new one, without "
                               "its state") from exc


def _execute(manager: SessionHost, identity: ExecutionSessionIdentity, code: str,
             language: Any, parent: ExecutionContext | None) -> CodeExecutionResult:
    cfg = manager.config
    session, sandbox = _connect(manager, identity, parent)
    budget = manager.budget_for(session)
    timeout_s = cfg.execution_timeout_ms / 1000
    price = cfg.price_per_second_usd
    box: dict[str, Any] = {}

    def body() -> None:
        token: CancellationToken | None = current_cancellation_token()
        unhook = token.on_cancel(lambda _reason: sandbox.interrupt()) if token else None
        started = time.monotonic()
        try:
            box["out"] = sandbox.run(code, language, timeout_s=timeout_s,
                                     max_output_chars=cfg.max_output_chars)
        except SandboxLostError as exc:
            box["lost"] = exc
            raise  # a failed tool call: the budget counts a retry
        finally:
            if unhook is not None:
                unhook()
            box["ms"] = int((time.monotonic() - started) * 1000)
            if price:
                report_usage(cost_usd=round(price * box["ms"] / 1000, 6))

    # The estimate covers the longest run (timeout plus the interrupt's grace): with it,
    # sandbox time never overshoots a ceiling.
    options = WrapOptions(operation_name="execute_code",
                          cost_estimate_hint=round(price * (timeout_s + 5), 6))
    outcome = run_sync(budget._state, budget, "tool", body, options)
    decision = outcome.decision
    if "ms" not in box:  # refused before it ran
        reason = outcome.reason or "the budget context refused the call"
        manager.metrics.errors.labels(kind="refused").inc()
        raise ExecutionRefusedError(reason, decision.value)
    ms = box["ms"]
    manager.metrics.duration.observe(ms)
    if "lost" in box or "out" not in box:
        error = manager.sanitizer(str(box.get("lost") or f"execution ended: {decision.value}"))
        manager.mark_error(session, error)
        manager.metrics.executions.labels(outcome="error").inc()
        manager.metrics.errors.labels(kind="sandbox").inc()
        return CodeExecutionResult(success=False, error=error, execution_time_ms=ms,
                                   output_type="error", sandbox_id=session.sandbox_id)
    out: RunOutput = box["out"]
    recorded = manager.store.record_execution(identity, ms, sandbox_id=session.sandbox_id)
    if recorded is not None and recorded.execution_count >= cfg.max_executions:
        manager.terminate(identity, "rotated")  # the next call gets a fresh session
    return _result(manager, session, out, ms, decision)


def _result(manager: SessionHost, session: ExecutionSession, out: RunOutput, ms: int,
            decision: Decision) -> CodeExecutionResult:
    clean = manager.sanitizer
    output = clean(out.output)
    if out.timed_out:
        outcome, error = "timeout", (f"Execution timed out after "
                                     f"{manager.config.execution_timeout_ms} ms and was "
                                     f"interrupted; the session keeps its state.")
    elif out.interrupted:
        outcome, error = "interrupted", "Execution interrupted: the conversation was stopped."
    elif out.error is not None:
        outcome, error = "error", clean(out.error)
    else:
        outcome, error = "ok", None
    manager.metrics.executions.labels(outcome=outcome).inc()
    if error is not None:
        manager.metrics.errors.labels(kind=outcome).inc()
    return CodeExecutionResult(
        success=error is None, output=output, error=error, execution_time_ms=ms,
        output_type="error" if error is not None else _output_type(output, out.json_result),
        truncated=out.truncated, timed_out=out.timed_out, interrupted=out.interrupted,
        sandbox_id=session.sandbox_id)


def _output_type(output: str, json_result: bool) -> OutputType:
    if json_result:
        return "json"
    text = output.strip()
    if text[:1] in "[{" and text:
        try:
            json.loads(text)
            return "json"
        except ValueError:
            pass
    lines = text.splitlines()
    if len(lines) > 1 and all("|" in line for line in lines[:2]):
        return "table"
    return "text"

