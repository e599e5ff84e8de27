"""Standing budgets (docs/quotas.md): quota rules matching trees by labels, limits per
period, grants drawn by every tree from every matching quota."""

from __future__ import annotations

from .api import Quotas, QuotaStatus
from .periods import Window, window_at
from .rules import QuotaRule

__all__ = ["QuotaRule", "QuotaStatus", "Quotas", "Window", "window_at"]
