"""Execution sessions: per conversation path, lazily created, reused, TTL-bound sandboxes
whose code executions are budgeted tool calls (the E2B execution-context specification)."""

from ..core.session_errors import (
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
from ..core.session_models import (
    CodeExecutionResult,
    ExecutionSession,
    ExecutionSessionIdentity,
    SessionConfig,
)
from ..store.sessions import SessionStore
from .manager import SessionManager
from .providers import LocalKernelProvider, SandboxProvider
from .sanitize import DEFAULT_RULES, OutputSanitizer, RedactionRule

__all__ = [
    "DEFAULT_RULES",
    "CodeExecutionResult",
    "EgressDeniedError",
    "ExecutionRefusedError",
    "ExecutionSession",
    "ExecutionSessionIdentity",
    "InvalidSessionInputError",
    "LocalKernelProvider",
    "OutputSanitizer",
    "RedactionRule",
    "SandboxElsewhereError",
    "SandboxLostError",
    "SandboxProvider",
    "SessionConfig",
    "SessionCreationError",
    "SessionCreationTimeoutError",
    "SessionError",
    "SessionManager",
    "SessionStore",
    "SessionStoreUnavailableError",
    "SessionTenantError",
    "TooManySessionsError",
    "UnsupportedLanguageError",
]
