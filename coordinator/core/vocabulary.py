"""The words Python and the Lua scripts share: stop reasons, context statuses, the
outcome a finish is asked for, a node record's status and the classes calls are counted
by, and the scripts' reply codes. Each is an enum here, once; a script writes
``StopReason.TIMEOUT`` as Python does and the store renders each member it names as its
value (store/scripts.py), and the tables below into its prelude."""

from __future__ import annotations

from enum import Enum, IntEnum


class Word(str, Enum):
    """A word of the vocabulary: a ``str`` (JSON, Redis and comparisons see its value),
    printed as its value on every Python version (3.10's ``str, Enum`` prints its name)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class StopReason(Word):
    """Why a context stopped or a call was refused (a context's ``reason`` field, a
    refusal's and a SafetyEvent's ``event_type``)."""

    BUDGET_EXCEEDED = "budget_exceeded"
    STEP_LIMIT_EXCEEDED = "step_limit_exceeded"
    RETRY_BUDGET_EXCEEDED = "retry_budget_exceeded"
    TOKEN_BUDGET_EXCEEDED = "token_budget_exceeded"
    TIMEOUT = "timeout"
    """The deadline passed (in Redis time)."""
    ABORTED = "aborted"
    CLOSED = "closed"
    STATE_CORRUPT = "state_corrupt"
    """A stored number is not a canonical integer: the level stops (fail closed)."""
    MISSING = "missing"
    """The context does not exist (a refusal only)."""
    QUOTA_GRANT = "quota_grant"
    """A quota grant of the root cannot cover the call: the caller tops it up."""
    UNPRICED_MODEL = "unpriced_model"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    FINAL_RESERVE = "final_reserve"
    """An ordinary call would reach into a level's final reserve (a refusal only: the
    context keeps running for its final calls)."""


class EdgeEvent(Word):
    """The SafetyEvents of a budget's edge that stop nothing (docs/degrade.md)."""

    DEGRADED = "degraded"
    """A call ran on a cheaper rung of its model ladder (once per context and pair)."""
    BUDGET_WARNING = "budget_warning"
    """A level's spend or steps reached a ``warn_at`` threshold (once per level and
    threshold)."""


class Status(Word):
    """A context hash's ``status``."""

    RUNNING = "running"
    STOPPED = "stopped"
    CLOSED = "closed"


class FinishOutcome(Word):
    """What a finish is asked for (settle.lua: ``OK``; release.lua: ``ERROR``, counting a
    retry, or ``SKIP``), and how a keyed call is remembered for its replays (``HALTED``:
    it ended without returning)."""

    OK = "ok"
    ERROR = "error"
    SKIP = "skip"
    HALTED = "halted"


class NodeStatus(Word):
    """A node record's ``status``: how the call it records ended."""

    OK = "ok"
    ERROR = "error"
    HALTED = "halted"
    ABORTED = "aborted"
    TIMEOUT = "timeout"
    LOST = "lost"
    """Reaped: its worker died while it ran."""


class CallCount(Word):
    """The classes calls are counted by on a context's hash (``n:<class>``)."""

    OK = "ok"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    HALTED = "halted"
    REFUSED = "refused"


CALL_COUNTS: dict[str, str] = {
    NodeStatus.OK: CallCount.OK, NodeStatus.ERROR: CallCount.ERROR,
    NodeStatus.ABORTED: CallCount.INTERRUPTED, NodeStatus.TIMEOUT: CallCount.INTERRUPTED,
    NodeStatus.LOST: CallCount.INTERRUPTED, NodeStatus.HALTED: CallCount.HALTED}
"""The class a finished call is counted in, by its node's status (a refused call, whose
node has a ``stop_reason``, counts as ``refused``)."""

ENDED_WITHOUT_RETURN: frozenset[str] = frozenset({
    NodeStatus.ERROR, NodeStatus.HALTED, NodeStatus.TIMEOUT, NodeStatus.ABORTED})
"""Node statuses of a call settled ``OK`` that is remembered ``HALTED`` for its replays
(a reaped, ``LOST`` one is remembered ``OK``: its replay goes on without running it)."""

DIMENSION_REASONS: dict[str, str] = {
    "usd": StopReason.BUDGET_EXCEEDED, "steps": StopReason.STEP_LIMIT_EXCEEDED,
    "retries": StopReason.RETRY_BUDGET_EXCEEDED}
"""The stop reason of a dimension's limit; every token dimension's is
``TOKEN_BUDGET_EXCEEDED``."""


CEILING_REASONS: frozenset[str] = frozenset({
    StopReason.BUDGET_EXCEEDED, StopReason.STEP_LIMIT_EXCEEDED,
    StopReason.RETRY_BUDGET_EXCEEDED, StopReason.TOKEN_BUDGET_EXCEEDED})
"""The stops a limit caused: the only ones raising that limit lifts (set_limits.lua)."""


class OpenRefusal(Word):
    """Why open.lua created no context."""

    EXISTS = "exists"
    MISSING = "missing"
    """An ancestor does not exist."""
    BAD_PATH = "bad_path"
    """An ancestor's own path is not the one given."""


class OpenCode(IntEnum):
    """open.lua's reply code."""

    REFUSED = 0
    OPENED = 1


class ReserveCode(IntEnum):
    """reserve.lua's reply code."""

    REFUSED = 0
    HELD = 1
    REPLAYED = 2


class FinishCode(IntEnum):
    """settle.lua's and release.lua's reply code (lease_flush.lua's too: ``ALREADY`` a
    batch applied before, ``FINISHED`` applied, ``CORRUPT`` stopped by a corrupt
    counter)."""

    ALREADY = 0
    FINISHED = 1
    CORRUPT = 3
    ORPHAN_CHARGED = 4
    ORPHAN_RECORDED = 5


class TakeCode(IntEnum):
    """lease_take.lua's reply code."""

    REFUSED = 0
    TAKEN = 1


class ChargeCode(IntEnum):
    """propagate.lua's reply code."""

    MISSING = -1
    """A level of the path does not exist: nothing written."""
    ALREADY = 0
    CHARGED = 1
    CORRUPT = 3


class AbortCode(IntEnum):
    """abort.lua's reply code."""

    MISSING = -1
    ALREADY = 0
    STOPPED = 1
    EARLY = 2


class LimitsCode(IntEnum):
    """set_limits.lua's reply code."""

    MISSING = -1
    CLOSED = 0
    CHANGED = 1
    CORRUPT = 2


ENUMS: tuple[type[Enum], ...] = (StopReason, Status, FinishOutcome, NodeStatus, CallCount,
                                 EdgeEvent, OpenRefusal, OpenCode, ReserveCode, FinishCode,
                                 TakeCode, ChargeCode, AbortCode, LimitsCode)
"""The enums whose members (``Enum.MEMBER``) a script names and reads as their values."""

TABLES: dict[str, dict[str, str] | frozenset[str]] = {
    "CALL_COUNTS": CALL_COUNTS, "ENDED_WITHOUT_RETURN": ENDED_WITHOUT_RETURN,
    "DIMENSION_REASONS": DIMENSION_REASONS, "CEILING_REASONS": CEILING_REASONS}
"""The mappings every script sees as Lua tables (a set as ``{word = true}``)."""
