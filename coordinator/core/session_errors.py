"""Typed errors of execution sessions; all subclass the project's BudgetCoordinatorError."""

from __future__ import annotations

from ..errors import BudgetCoordinatorError

TOO_MANY_SESSIONS = "Too many active analysis sessions. Please wait a moment."


class SessionError(BudgetCoordinatorError):
    """Base class of the errors execution sessions raise on purpose."""


class InvalidSessionInputError(SessionError, ValueError):
    """An identity, a configuration value or an argument is not usable. Nothing changed."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} must be {expected}; got {value!r}")


class SessionTenantError(SessionError, PermissionError):
    """The identity's tenant is not the tenant this store (coordinator) serves."""

    def __init__(self, tenant_id: str, served: str) -> None:
        self.tenant_id = tenant_id
        self.served = served
        super().__init__(f"tenant {tenant_id!r} cannot use sessions of tenant {served!r}")


class TooManySessionsError(SessionError):
    """The tenant already has its cap of active sessions (creations in flight included).
    The message is fit to show to a user."""

    def __init__(self, tenant_id: str, cap: int, active: int) -> None:
        self.tenant_id = tenant_id
        self.cap = cap
        self.active = active
        super().__init__(f"{TOO_MANY_SESSIONS} (tenant {tenant_id!r}: {active} active, "
                         f"cap {cap})")


class SessionCreationError(SessionError, RuntimeError):
    """The sandbox could not be created; nothing was recorded as active."""

    def __init__(self, provider: str, cause: BaseException | str) -> None:
        self.provider = provider
        self.cause = cause
        super().__init__(f"{provider} sandbox creation failed: {cause}")


class SessionCreationTimeoutError(SessionCreationError):
    """Creating the sandbox (ours, or another process's for the same identity) took longer
    than the creation timeout."""

    def __init__(self, provider: str, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        super().__init__(provider, f"not ready within {timeout_ms} ms")


class SessionStoreUnavailableError(SessionError, ConnectionError):
    """Redis could not be reached: sessions fail closed (no unrecorded, unbudgeted run)."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        self.operation = operation
        self.cause = cause
        super().__init__(f"session store unavailable during {operation}: {cause}")


class SandboxElsewhereError(SessionError):
    """The session's sandbox lives on another host (a local kernel): this process can read
    the record but cannot reach the sandbox. Route the call to ``host``."""

    def __init__(self, sandbox_id: str, host: str, here: str) -> None:
        self.sandbox_id = sandbox_id
        self.host = host
        self.here = here
        super().__init__(f"sandbox {sandbox_id!r} lives on host {host!r}, not on {here!r}; "
                         f"run this session's code there")


class SandboxLostError(SessionError):
    """The sandbox named by a record is gone (its kernel died, E2B dropped it)."""

    def __init__(self, sandbox_id: str, why: str) -> None:
        self.sandbox_id = sandbox_id
        self.why = why
        super().__init__(f"sandbox {sandbox_id!r} is lost: {why}")


class UnsupportedLanguageError(SessionError, ValueError):
    """The provider has no runtime for this language here."""

    def __init__(self, language: str, provider: str) -> None:
        self.language = language
        self.provider = provider
        super().__init__(f"{provider} sandboxes cannot run {language!r} here")


class ExecutionRefusedError(SessionError):
    """The session's budget context refused the execution (the conversation is stopped,
    aborted, past its deadline or out of budget). The code did not run."""

    def __init__(self, reason: str, decision: str) -> None:
        self.reason = reason
        self.decision = decision
        super().__init__(f"code execution refused ({decision}): {reason}")


class EgressDeniedError(SessionError, PermissionError):
    """The conversation's egress hooks refused a URL the session was told to reach."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(f"egress to {url!r} refused by the conversation's egress hooks")
