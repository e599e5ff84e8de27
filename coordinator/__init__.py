"""Distributed budget coordinator: one ceiling for a whole tree of LLM agents, wherever
they run. State lives in Redis; atomic Lua scripts reserve, settle and roll spend up to
every ancestor."""

from .cancellation import CancellationToken, CancelledByContext
from .context import (
    ExecutionContext,
    current_cancellation_token,
    current_context,
    current_limits,
)
from .coordinator import Coordinator
from .errors import (
    DeadlineExceededError,
    PromptEvaluationError,
    TokenBudgetExceededError,
)
from .ledger import LedgerReservation, TokenLedger
from .models import (
    ActiveLimits,
    ChainMetadata,
    ContextSnapshot,
    Decision,
    ExecutionConfig,
    NodeRecord,
    SafetyEvent,
    TokenBudget,
    TokenTotals,
    WrapOptions,
)
from .pipeline import ShieldPipeline, ToolCallContext
from .policy import PolicyContext, PolicyDecision
from .pricing import set_price
from .usage import report_usage

__all__ = [
    "ActiveLimits",
    "DeadlineExceededError",
    "LedgerReservation",
    "PromptEvaluationError",
    "TokenBudgetExceededError",
    "TokenLedger",
    "current_limits",
    "CancellationToken",
    "CancelledByContext",
    "ChainMetadata",
    "ContextSnapshot",
    "Coordinator",
    "Decision",
    "ExecutionConfig",
    "ExecutionContext",
    "NodeRecord",
    "PolicyContext",
    "PolicyDecision",
    "SafetyEvent",
    "ShieldPipeline",
    "TokenBudget",
    "TokenTotals",
    "ToolCallContext",
    "WrapOptions",
    "current_cancellation_token",
    "current_context",
    "report_usage",
    "set_price",
]
