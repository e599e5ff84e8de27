"""What a refusal by a quota says: the rule, the bucket, the period and its window, the
numbers, and when the next window opens."""

from __future__ import annotations

from datetime import datetime, timezone

from ..store.quotas_store import NotGranted
from .periods import Window
from .rules import QuotaRule


def amount_text(dim: str, amount: int) -> str:
    """An amount as a person reads it ($ for micro-USD)."""
    if dim == "usd":
        return f"${amount / 1_000_000:.6f}".rstrip("0").rstrip(".")
    return f"{amount} {'tokens' if dim == 'tok' else 'calls'}"


def next_window_text(window: Window) -> str:
    if not window.end_ms:
        return "never (a total)"
    opens = datetime.fromtimestamp(window.end_ms / 1000, timezone.utc)
    return opens.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def refusal_detail(rule: QuotaRule, bucket: str, window: Window, refused: NotGranted) -> str:
    """The detail of a ``quota_exceeded`` HALT."""
    dim = refused.dim
    return (f"quota {rule.id} bucket {bucket} period {rule.period} window {window.id}: "
            f"{amount_text(dim, refused.spent)} spent and "
            f"{amount_text(dim, refused.in_grants)} held in grants of "
            f"{amount_text(dim, refused.limit)}; next window opens "
            f"{next_window_text(window)}")
