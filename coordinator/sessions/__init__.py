"""Execution sessions: per conversation path, lazily created, reused, TTL-bound sandboxes
whose code executions are budgeted tool calls (the E2B execution-context specification)."""

from .errors import (
    EgressDeniedError,
    ExecutionRefusedError,
    InvalidSessionInputError,
    SandboxElsewhereError,
    SandboxLostError,
    SessionCreationError,
    SessionCreationTimeoutError,
    SessionError,
    SessionStoreUnavailableError,
    SessionTenantError,
    TooManySessionsError,
    UnsupportedLanguageError,
)
from .models import (
    CodeExecutionResult,
    ExecutionSession,
    ExecutionSessionIdentity,
    SessionConfig,
)
from .store import SessionStore

__all__ = [
    "CodeExecutionResult",
    "EgressDeniedError",
    "ExecutionRefusedError",
    "ExecutionSession",
    "ExecutionSessionIdentity",
    "InvalidSessionInputError",
    "SandboxElsewhereError",
    "SandboxLostError",
    "SessionConfig",
    "SessionCreationError",
    "SessionCreationTimeoutError",
    "SessionError",
    "SessionStore",
    "SessionStoreUnavailableError",
    "SessionTenantError",
    "TooManySessionsError",
    "UnsupportedLanguageError",
]
