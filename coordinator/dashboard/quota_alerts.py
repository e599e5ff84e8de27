"""Alerts on quota buckets (docs/quotas.md): the same fraction thresholds as trees (the
tenant-wide alert rules' ``fractions``, 50/80/100 % by default), crossed by a bucket's
spend in its current window; one alert per bucket, window and threshold (a new window
alerts again), and for a jump past several thresholds one alert, the highest's (as a
tree's, dashboard/model.py crossings)."""

from __future__ import annotations

from collections.abc import Sequence

from ..quotas import Quotas
from ..runtime.coordinator import Coordinator
from .model import Alert, AlertRule


def quota_crossings(coord: Coordinator, rules: Sequence[AlertRule], now_ms: int
                    ) -> list[Alert]:
    """For each bucket's window, the highest threshold it is at or past: the largest
    fraction of a limit spent over its dimensions."""
    fractions = sorted({f for r in rules if not r.match for f in r.fractions})
    if not fractions:
        return []
    quotas = Quotas(coord)
    out = []
    for rule in quotas.rules():
        for s in quotas.status(rule):
            used = [s.spent[d] / cap if cap else 1.0 for d, cap in s.limits.items()]
            fraction = max(used, default=0.0)
            ceiling = s.limits.get("usd")
            labels = {"quota": rule.id, "bucket": s.bucket, "window": s.window}
            crossed = [f for f in fractions if fraction >= f - 1e-12]
            if crossed:
                out.append(Alert(f"quota:{rule.id}:{s.window}:{s.bucket}", rule.id,
                                 f"fraction:{crossed[-1]:g}", fraction, labels,
                                 s.spent["usd"] / 1e6,
                                 ceiling / 1e6 if ceiling is not None else None, now_ms))
    return out
