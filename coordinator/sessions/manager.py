"""SessionManager: the lifecycle of execution sessions (lazy creation with atomic tenant
admission, reuse, rotation, termination, cleanup, path events)."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time

from ..context.execution import ExecutionContext
from ..core.session_errors import (
    EgressDeniedError,
    SandboxElsewhereError,
    SandboxLostError,
    SessionCreationError,
    SessionCreationTimeoutError,
    SessionError,
    TooManySessionsError,
)
from ..core.session_models import (
    CodeExecutionResult,
    ExecutionSession,
    ExecutionSessionIdentity,
    Language,
    SessionConfig,
)
from ..models import Decision, ExecutionConfig
from ..runtime.coordinator import Coordinator
from ..store.sessions import SessionStore, from_ms
from .execute import execute_code
from .providers.base import Sandbox, SandboxInfo, SandboxProvider
from .sanitize import OutputSanitizer
from .telemetry import GET_OR_CREATE, SessionMetrics, default_metrics, span

log = logging.getLogger("coordinator.sessions")

LOST = "sandbox lost: its process is gone"
"""The error recorded on a session whose sandbox was found gone."""
WAIT_POLL_S = 0.05
TOKEN_TTL_S = 3600
DEFAULT_ROOT_BUDGET = ExecutionConfig(max_cost_usd=10.0, max_steps=10_000,
                                      max_retries_total=1_000)
"""Limits of the root opened for a session whose caller gave no budget context."""


def info_of(session: ExecutionSession) -> SandboxInfo:
    """Where a session's sandbox is."""
    return SandboxInfo(session.sandbox_id, session.host, session.connection)


class SessionManager:
    """Execution sessions of one coordinator (its Redis, its tenant), with sandboxes from
    ``provider`` (default: local Jupyter kernels). ``root_budget``: the limits of the root
    context opened for a session created without a ``parent`` budget context."""

    def __init__(self, coordinator: Coordinator | None = None,
                 provider: SandboxProvider | None = None,
                 config: SessionConfig | None = None, *,
                 sanitizer: OutputSanitizer | None = None,
                 metrics: SessionMetrics | None = None,
                 root_budget: ExecutionConfig = DEFAULT_ROOT_BUDGET) -> None:
        self.coordinator = coordinator or Coordinator.default()
        self.store = SessionStore.for_coordinator(self.coordinator)
        if provider is None:
            from .providers.local import LocalKernelProvider
            provider = LocalKernelProvider()
        self.provider: SandboxProvider = provider
        self.config = config or SessionConfig()
        self.sanitizer = sanitizer or OutputSanitizer()
        root = getattr(provider, "root", None)
        if root is not None:  # a local sandbox's folder is shown as /sandbox
            self.sanitizer = self.sanitizer.with_paths({str(root): "/sandbox"})
        self.metrics = metrics or default_metrics()
        self.root_budget = root_budget
        self._sandboxes: dict[str, Sandbox] = {}
        self._budgets: dict[str, ExecutionContext] = {}
        self._mine: dict[str, ExecutionSessionIdentity] = {}
        """Sessions this manager created, by sandbox id: close() ends them."""
        self._lock = threading.Lock()

    # -- creation and reuse ----------------------------------------------------------

    def get_or_create(self, identity: ExecutionSessionIdentity,
                      parent: ExecutionContext | None = None) -> ExecutionSession:
        """The path's usable session, created (sandbox and budget context, a child of
        ``parent``) when it has none. Raises TooManySessionsError at the tenant's cap,
        SessionCreationError when the sandbox cannot be made."""
        with span(GET_OR_CREATE, identity):
            return self._get_or_create(identity, parent)

    def _get_or_create(self, identity: ExecutionSessionIdentity,
                       parent: ExecutionContext | None) -> ExecutionSession:
        cfg = self.config
        deadline = time.monotonic() + cfg.creation_timeout_ms / 1000
        claim_id = secrets.token_hex(12)
        reaped = False
        while True:
            got = self.store.acquire(identity, cap=cfg.max_sessions_per_tenant,
                                     max_executions=cfg.max_executions, claim_id=claim_id,
                                     claim_ttl_ms=cfg.creation_timeout_ms)
            if got.retired_sandbox:
                self._retired(identity, got.retired_sandbox)
            if got.kind == "existing":
                assert got.session is not None
                return got.session
            if got.kind == "cap" and not reaped:  # sessions whose sandbox is gone free
                reaped = True                     # their place first
                if self.reap_lost(identity.tenant_id):
                    continue
            if got.kind == "cap":
                self.metrics.errors.labels(kind="tenant_cap").inc()
                raise TooManySessionsError(identity.tenant_id, cfg.max_sessions_per_tenant,
                                           got.count)
            if got.kind == "wait":  # another caller is creating this path's session
                if time.monotonic() > deadline:
                    raise SessionCreationTimeoutError(self.provider.name,
                                                      cfg.creation_timeout_ms)
                time.sleep(WAIT_POLL_S)
                continue
            made = self._create(identity, parent, claim_id)
            if made is not None:
                return made
            if time.monotonic() > deadline:  # our claim lapsed and time is up
                raise SessionCreationTimeoutError(self.provider.name, cfg.creation_timeout_ms)

    def _create(self, identity: ExecutionSessionIdentity, parent: ExecutionContext | None,
                claim_id: str) -> ExecutionSession | None:
        cfg = self.config
        labels = {"tenant_id": identity.tenant_id,
                  "conversation_id": identity.conversation_id, "path_id": identity.path_id}
        budget: ExecutionContext | None = None
        try:
            # The conversation's hooks (before_tool_call, before_egress) also guard the
            # session's executions in this process.
            budget = (parent.spawn_child(pipeline=parent.pipeline) if parent is not None
                      else ExecutionContext(self.root_budget, coordinator=self.coordinator))
            sandbox = self.provider.create(labels, timeout_s=cfg.creation_timeout_ms / 1000,
                                           ttl_s=cfg.ttl_ms / 1000,
                                           template=cfg.sandbox_template)
        except BaseException as exc:
            self.store.abandon(identity, claim_id)
            if budget is not None:
                budget.close()
            self.metrics.errors.labels(kind="creation").inc()
            if isinstance(exc, SessionError) or not isinstance(exc, Exception):
                raise
            raise SessionCreationError(self.provider.name, exc) from exc
        info = sandbox.info
        fields = {**labels, "sandbox_id": info.sandbox_id, "provider": self.provider.name,
                  "host": info.host, "connection": _json(info.connection),
                  "budget_root": budget.root_id, "budget_path": ",".join(budget.path),
                  "last_error": "", "terminated_reason": ""}
        try:
            session = self.store.commit(identity, claim_id=claim_id, ttl_ms=cfg.ttl_ms,
                                        fields=fields)
        except BaseException:
            self._kill(info)
            budget.close()
            raise
        if session is None:  # our claim lapsed (creation outlived the timeout): undo
            log.warning("session creation for %s outlived its claim; retrying", identity)
            self._kill(info)
            budget.close()
            return None
        with self._lock:
            self._sandboxes[info.sandbox_id] = sandbox
            self._budgets[info.sandbox_id] = budget
            self._mine[info.sandbox_id] = identity
        self.metrics.created.labels(provider=self.provider.name).inc()
        self._refresh_gauge(identity.tenant_id)
        return session

    # -- handles ---------------------------------------------------------------------

    def sandbox_for(self, session: ExecutionSession) -> Sandbox:
        """This process's connection to the session's sandbox. SandboxElsewhereError when
        it lives on another host; SandboxLostError when it is gone."""
        with self._lock:
            known = self._sandboxes.get(session.sandbox_id)
        if known is not None:
            return known
        sandbox = self.provider.connect(info_of(session))
        with self._lock:
            self._sandboxes[session.sandbox_id] = sandbox
        return sandbox

    def budget_for(self, session: ExecutionSession) -> ExecutionContext:
        """A handle on the session's budget context (this process's, or joined through a
        token minted for it)."""
        with self._lock:
            known = self._budgets.get(session.sandbox_id)
        if known is not None:
            return known
        c = self.coordinator
        token = c.token_codec().encode(root=session.budget_root, path=session.budget_path,
                                       tenant=c.tenant, ttl_s=TOKEN_TTL_S,
                                       now=c.redis_now_ms() / 1000)
        ctx = ExecutionContext.attach(token, coordinator=c)
        with self._lock:
            self._budgets[session.sandbox_id] = ctx
        return ctx

    # -- execution -------------------------------------------------------------------

    def execute_code(self, identity: ExecutionSessionIdentity, code: str,
                     language: Language = "python", *,
                     parent: ExecutionContext | None = None) -> CodeExecutionResult:
        """Run ``code`` in the path's session (created when needed) as a budgeted tool
        call of the session's context. See :mod:`coordinator.sessions.execute`."""
        return execute_code(self, identity, code, language, parent)

    def check_egress(self, identity: ExecutionSessionIdentity, url: str, *,
                     parent: ExecutionContext | None = None) -> Decision:
        """Ask the conversation's ``before_egress`` hooks whether the session may reach
        ``url`` (call it before handing a URL to code or a sandbox's network allowlist):
        ALLOW, or EgressDeniedError. The hooks are ``parent``'s, else those of the
        session's budget context in this process."""
        ctx = parent if parent is not None else self.budget_for(self.get_or_create(identity))
        decision = ctx.check_egress(url)
        if decision != Decision.ALLOW:
            self.metrics.errors.labels(kind="egress_denied").inc()
            raise EgressDeniedError(url)
        return decision

    # -- ending ----------------------------------------------------------------------

    def terminate(self, identity: ExecutionSessionIdentity, reason: str = "manual") -> bool:
        """Terminate the path's active session and kill its sandbox; the record stays.
        False when it had none active."""
        session = self.store.load(identity)
        if session is None:
            return False
        done = self.store.terminate(identity, reason, sandbox_id=session.sandbox_id)
        if done.kind != "ok":
            return False
        self._ended(session, reason)
        return True

    def mark_error(self, session: ExecutionSession, error: str) -> None:
        """The sandbox failed: status error (out of the cap), sandbox killed."""
        done = self.store.terminate(session.identity, "error", status="error",
                                    last_error=error, sandbox_id=session.sandbox_id)
        if done.kind == "ok":
            self._ended(session, "error")

    def cleanup_expired(self) -> int:
        """Expire every active session past its expires_at (Redis time) and kill its
        sandbox; returns how many. For a scheduler (or ``budgetctl sessions cleanup``)."""
        cutoff = from_ms(self.store.now_ms())
        count = 0
        for identity in self.store.list_expired(cutoff):
            session = self.store.load(identity)
            if session is None:
                continue
            done = self.store.terminate(identity, "expired", status="expired",
                                        sandbox_id=session.sandbox_id, only_if_expired=True)
            if done.kind == "ok":
                self._ended(session, "expired")
                count += 1
        return count

    def has_active(self, identity: ExecutionSessionIdentity) -> bool:
        """Whether the path has a usable session (active, unexpired in Redis time, under
        the execution limit, its sandbox not known to be gone: such a record is marked
        ``error`` here)."""
        session, now_ms = self.store.load_at(identity)
        usable = (session is not None and session.status == "active"
                  and session.expires_at > from_ms(now_ms)
                  and session.execution_count < self.config.max_executions)
        if session is not None and usable and self._gone(session):
            self.mark_error(session, LOST)
            return False
        return usable

    def reap_lost(self, tenant_id: str) -> int:
        """Mark ``error`` the tenant's active sessions whose sandbox this manager's
        provider knows to be gone (a local kernel of this host whose process ended), so
        they no longer count against the cap; returns how many."""
        count = 0
        for identity in self.store.list_active_for_tenant(tenant_id):
            session = self.store.load(identity)
            if session is not None and session.status == "active" and self._gone(session):
                self.mark_error(session, LOST)
                count += 1
        return count

    def _gone(self, session: ExecutionSession) -> bool:
        alive = getattr(self.provider, "alive", None)
        return (session.provider == self.provider.name and alive is not None
                and alive(info_of(session)) is False)

    # -- path lifecycle (the specification's table) ----------------------------------

    def on_branch(self, identity: ExecutionSessionIdentity) -> None:
        """A branch was created: nothing happens (its session is created lazily, so it
        never sees its parent path's sandbox state)."""

    def on_edit(self, identity: ExecutionSessionIdentity) -> ExecutionSession | None:
        """A message was edited on this path: its session (if any) continues unchanged."""
        return self.store.load(identity)

    def on_merge(self, source: ExecutionSessionIdentity) -> bool:
        """``source`` was merged into another path: terminate its session."""
        return self.terminate(source, "merged")

    def on_delete(self, identity: ExecutionSessionIdentity) -> bool:
        """The path was deleted: terminate its session."""
        return self.terminate(identity, "deleted")

    def on_archive(self, identity: ExecutionSessionIdentity) -> bool:
        """The path was archived: terminate its session."""
        return self.terminate(identity, "archived")

    # -- helpers ---------------------------------------------------------------------

    def _ended(self, session: ExecutionSession, reason: str) -> None:
        if session.provider == self.provider.name:
            self._kill(info_of(session))
        else:
            log.warning("sandbox %s is a %s sandbox: this %s manager cannot kill it",
                        session.sandbox_id, session.provider, self.provider.name)
        with self._lock:
            budget = self._budgets.pop(session.sandbox_id, None)
            self._mine.pop(session.sandbox_id, None)
        if budget is not None:
            budget.close()  # closes it in Redis when this process opened it
        self.metrics.terminated.labels(reason=reason).inc()
        self._refresh_gauge(session.identity.tenant_id)

    def _retired(self, identity: ExecutionSessionIdentity, sandbox_id: str) -> None:
        """acquire retired the path's session (expired or rotated): kill its sandbox."""
        old = self.store.load(identity)
        if old is None or old.sandbox_id != sandbox_id:  # already replaced: in history
            old = next((h for h in self.store.history(identity)
                        if h.sandbox_id == sandbox_id), None)
        if old is not None:
            self._ended(old, old.terminated_reason or "expired")

    def _kill(self, info: SandboxInfo) -> None:
        with self._lock:
            self._sandboxes.pop(info.sandbox_id, None)
        try:
            self.provider.kill(info)
        except SandboxElsewhereError as exc:
            log.warning("cannot kill %s from here: %s", info.sandbox_id, exc)
        except (SandboxLostError, OSError, RuntimeError) as exc:
            log.warning("killing %s failed: %s", info.sandbox_id, exc)

    def _refresh_gauge(self, tenant_id: str) -> None:
        active = self.store.list_active_for_tenant(tenant_id)
        self.metrics.active.labels(tenant=tenant_id).set(len(active))

    def close(self) -> None:
        """End the sessions this manager created (each record terminated with reason
        ``closed``, its sandbox killed, its budget context closed), then let go of the
        other handles. :meth:`detach` lets go without ending them."""
        with self._lock:
            mine = list(self._mine.items())
        for sandbox_id, identity in mine:
            try:
                self._close_one(identity, sandbox_id)
            except SessionError as exc:  # Redis unreachable: the records expire by TTL
                log.warning("session %s not ended at close: %s", identity, exc)
        self.detach()

    def _close_one(self, identity: ExecutionSessionIdentity, sandbox_id: str) -> None:
        session = self.store.load(identity)
        if session is None or session.sandbox_id != sandbox_id:
            return
        done = self.store.terminate(identity, "closed", sandbox_id=sandbox_id)
        if done.kind == "ok":
            self._ended(session, "closed")

    def detach(self) -> None:
        """Let go of this process's budget handles and sandboxes without ending any
        session (an E2B sandbox meant to outlive the process; local kernels this process
        started still end with it)."""
        with self._lock:
            budgets, self._budgets = list(self._budgets.values()), {}
            self._sandboxes.clear()
            self._mine.clear()
        for budget in budgets:
            budget.detach()
        closer = getattr(self.provider, "close", None)
        if closer is not None:
            closer()


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
