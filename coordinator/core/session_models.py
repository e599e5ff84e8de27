"""The data models of execution sessions: identity, record, configuration, result."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from ..models import _Frozen

ID_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
"""Tenant, conversation and path ids: key-safe (no ':' or braces), at most 128 chars."""

SessionStatus = Literal["active", "expired", "error", "terminated"]
Language = Literal["python", "javascript"]
OutputType = Literal["text", "json", "table", "error"]


class ExecutionSessionIdentity(_Frozen):
    """Names one execution session: each conversation path has at most one active one.
    (The specification's ``ExecutionContextIdentity``.)"""

    tenant_id: str = Field(pattern=ID_PATTERN)
    """Tenant owning the conversation."""
    conversation_id: str = Field(pattern=ID_PATTERN)
    """Conversation containing the path."""
    path_id: str = Field(pattern=ID_PATTERN)
    """Path within the conversation (the primary path or a branch)."""

    @property
    def member(self) -> str:
        """The session's name inside its tenant's indexes."""
        return f"{self.conversation_id}:{self.path_id}"


class ExecutionSession(_Frozen):
    """A sandboxed execution environment of one conversation path, as recorded in Redis.
    (The specification's ``ExecutionContext``; here a session *has* a budget
    ``ExecutionContext``: ``budget_path``.)"""

    identity: ExecutionSessionIdentity
    """Whose session this is."""
    sandbox_id: str
    """The provider's sandbox id."""
    provider: str
    """Which provider made the sandbox (``local``, ``e2b``)."""
    host: str = ""
    """Host that runs the sandbox (local kernels); empty for remote sandboxes."""
    connection: dict[str, str] = Field(default_factory=dict)
    """Connection details (the specification's MCP URL and token). No secret is stored
    here: a local kernel's key stays in its 0600 connection file."""
    created_at: datetime
    """When the session was created (Redis time)."""
    last_used_at: datetime
    """When code last ran in it (Redis time)."""
    expires_at: datetime
    """When it expires if unused; every execution moves it to now + ``ttl_ms``."""
    updated_at: datetime
    """When the record last changed (Redis time)."""
    execution_count: int = 0
    """Code executions run in it."""
    total_execution_time_ms: int = 0
    """Their summed duration."""
    status: SessionStatus = "active"
    """``active``; ``expired`` (TTL passed), ``error`` (the sandbox failed), ``terminated``."""
    last_error: str | None = None
    """The last sandbox failure (sanitized)."""
    terminated_reason: str | None = None
    """Why it stopped being active: expired, rotated, error, manual, merged, deleted,
    archived."""
    ttl_ms: int
    """Inactivity TTL this session was created with."""
    budget_root: str = ""
    """Root id of the budget tree the session's context belongs to."""
    budget_path: tuple[str, ...] = ()
    """Context ids from that root down to the session's own budget context."""
    generation: int = 1
    """How many sessions this path has had (1 + rotations and re-creations)."""

    @property
    def budget_chain_id(self) -> str:
        """Chain id of the session's budget context ('' when it has none)."""
        return self.budget_path[-1] if self.budget_path else ""


class SessionConfig(_Frozen):
    """The manager's configuration (the specification's defaults)."""

    ttl_ms: int = Field(default=30 * 60 * 1000, ge=1, le=30 * 24 * 3600 * 1000)
    """Inactivity TTL (default 30 minutes)."""
    max_executions: int = Field(default=100, ge=1, le=10**9)
    """Executions after which a session is rotated (default 100)."""
    max_sessions_per_tenant: int = Field(default=10, ge=1, le=10**6)
    """Active sessions (and creations in flight) a tenant may hold (default 10)."""
    creation_timeout_ms: int = Field(default=60_000, ge=1, le=3600 * 1000)
    """How long a creation may take, ours or another process's we wait for."""
    execution_timeout_ms: int = Field(default=30_000, ge=1, le=24 * 3600 * 1000)
    """Per-execution timeout; the run is interrupted, the session kept."""
    max_output_chars: int = Field(default=50_000, ge=1, le=10**8)
    """Output beyond this is cut and the result says ``truncated``."""
    price_per_second_usd: float = Field(default=0.0, ge=0.0, le=1e6)
    """Charged per second of sandbox time to the session's budget context (0 = steps
    only)."""
    sandbox_template: str = Field(default="base", max_length=256)
    """Provider template (E2B template id; ignored by local kernels)."""


class CodeExecutionResult(_Frozen):
    """The outcome of one ``execute_code`` (the specification's ``ExecutionResult``)."""

    success: bool
    """True when the code ran to completion without raising."""
    output: str = ""
    """Sanitized stdout, rich results and displayed values, cut at ``max_output_chars``."""
    error: str | None = None
    """Sanitized error (exception, timeout, interruption), or None."""
    execution_time_ms: int = 0
    """Wall time of the run."""
    output_type: OutputType = "text"
    """How the output reads: json, table, text, or error."""
    truncated: bool = False
    """True when output was cut at the size limit."""
    timed_out: bool = False
    """True when the run hit the execution timeout (the kernel was interrupted)."""
    interrupted: bool = False
    """True when an abort of the conversation interrupted the run."""
    sandbox_id: str = ""
    """The sandbox the code ran in."""
