"""What the dashboard's Quotas page shows (docs/quotas.md): each bucket of each rule in
its current window, with its bars (spent, held in grants, against the limit), its spend
over the last windows, and the trees drawing from it now."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..quotas import QuotaRule, Quotas
from ..quotas.refusal import amount_text

HISTORY_WINDOWS = 7


def quota_page(quotas: Quotas, rules: Sequence[QuotaRule]) -> list[dict[str, Any]]:
    """One entry per bucket of ``rules``: rule, bucket, period, window, resets_in_s, bars
    (per limited dimension: spent and held as percent of the limit, and their texts),
    history (window, percent of the limit spent, text) and trees (roots holding a
    grant)."""
    out = []
    for rule in rules:
        grants = quotas.qs.grants(rule.id)
        for s in quotas.status(rule):
            bars = []
            for dim, cap in s.limits.items():
                spent, held = s.spent[dim], s.in_grants[dim]
                bars.append({"dim": dim, "limit": amount_text(dim, cap),
                             "spent": amount_text(dim, spent), "held": amount_text(dim, held),
                             "spent_pct": min(100.0, 100 * spent / cap) if cap else 100.0,
                             "held_pct": min(100.0, 100 * held / cap) if cap else 0.0})
            main_dim, main_cap = next(iter(s.limits.items()))
            history = [{"window": w, "text": amount_text(main_dim, spent[main_dim]),
                        "pct": min(100.0, 100 * spent[main_dim] / main_cap) if main_cap
                        else 100.0}
                       for w, spent in quotas.history(rule, s.bucket, HISTORY_WINDOWS).items()]
            prefix = f"{s.bucket}|{s.window}|"
            trees = sorted(m[len(prefix):] for m in grants if m.startswith(prefix))
            out.append({"rule": rule.id, "bucket": s.bucket, "period": rule.period,
                        "tz": rule.tz, "window": s.window, "resets_in_s": s.resets_in_s,
                        "bars": bars, "history": history, "trees": trees})
    return out
