"""The public data models: frozen, keyword-only, validated at construction.

Invalid values raise :class:`coordinator.errors.InvalidConfigError` (which is also the
Limits specification's ``PromptEvaluationError(phase="preflight")``). The import surface:
the base and checks live in models_base.py, the configuration in models_config.py, the
records in models_records.py.
"""

from __future__ import annotations

from .models_base import (
    MAX_COUNT,
    MAX_LABEL,
    MAX_TIMEOUT_MS,
    MAX_USD,
    _Frozen,
    check_count,
    check_slug,
    check_usd,
    in_range,
)
from .models_config import (
    ChainMetadata,
    ExecutionConfig,
    LeasePolicy,
    TokenBudget,
    WrapOptions,
    validate_deadline,
)
from .models_degrade import Degrade
from .models_records import (
    ActiveLimits,
    BudgetWarning,
    CallInfo,
    ContextSnapshot,
    Decision,
    NodeKind,
    NodeRecord,
    NodeStatus,
    SafetyEvent,
    TokenTotals,
)

__all__ = [
    "MAX_COUNT", "MAX_LABEL", "MAX_TIMEOUT_MS", "MAX_USD", "ActiveLimits", "BudgetWarning",
    "CallInfo", "ChainMetadata", "ContextSnapshot", "Decision", "Degrade", "ExecutionConfig",
    "LeasePolicy", "NodeKind", "NodeRecord", "NodeStatus", "SafetyEvent", "TokenBudget",
    "TokenTotals", "WrapOptions", "_Frozen", "check_count", "check_slug", "check_usd",
    "in_range", "validate_deadline",
]
