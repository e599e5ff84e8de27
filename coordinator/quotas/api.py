"""The quota API (what ``budgetctl quota`` and the dashboard call): set, read, list and
delete rules at runtime, each change audited and applied to the next call of every tree;
the state of each bucket's window."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.durations import utc_iso
from ..errors import QuotaNotFoundError, QuotaRuleError
from ..runtime.actor import user_at_host
from ..runtime.coordinator import Coordinator
from .keeper import keeper_of
from .periods import window_at
from .rules import DIMS, RULE_FIELDS, QuotaRule


@dataclass(frozen=True)
class QuotaStatus:
    """One bucket's window: its spend, what trees hold in grants, its limits."""

    rule_id: str
    bucket: str
    period: str
    window: str
    spent: dict[str, int]
    """By dimension (usd in micro-USD, calls, tok)."""
    in_grants: dict[str, int]
    limits: dict[str, int]
    resets_in_s: float | None
    """Seconds until the next window opens (None: a total never resets)."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON of ``budgetctl quota list --json`` and the dashboard's API: per
        dimension ``spent_*``, ``in_grants_*`` and ``limit_*`` (None: not limited), in
        dollars (``*_usd``), tokens and calls."""
        out: dict[str, Any] = {"rule": self.rule_id, "bucket": self.bucket,
                               "period": self.period, "window": self.window}
        for dim, name in JSON_DIMS.items():
            scale = 1_000_000 if dim == "usd" else 1
            limit = self.limits.get(dim)
            out[f"spent_{name}"] = _json_amount(self.spent[dim], scale)
            out[f"in_grants_{name}"] = _json_amount(self.in_grants[dim], scale)
            out[f"limit_{name}"] = None if limit is None else _json_amount(limit, scale)
        out["resets_in_s"] = self.resets_in_s
        return out


JSON_DIMS = {"usd": "usd", "tok": "tokens", "calls": "calls"}
"""A dimension's name in JSON fields (``spent_usd``, ``limit_tokens``)."""


def _json_amount(amount: int, scale: int) -> int | float:
    return amount / scale if scale > 1 else amount


class Quotas:
    """Quota rules of one coordinator's tenant."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.keeper = keeper_of(coord)
        self.qs = self.keeper.qs

    def set(self, rule: QuotaRule, *, actor: str | None = None) -> QuotaRule:
        """Create or change a rule (its match cannot change). Every grant of the rule
        ends, so the next call of every tree draws under the limits now set; lowering a
        limit below the spend stops new calls and rewrites no spend. Returns the rule
        stored (with its version)."""
        body = rule.to_json()
        version = self.qs.put_rule(body, rule.id, rule.match, rule.limits,
                                   actor or user_at_host())
        self.keeper.revoke(rule.id)
        self.keeper.rules(fresh=True)
        return dataclasses.replace(rule, version=version)

    def change(self, rule_id: str, changes: Mapping[str, object], *,
               actor: str | None = None) -> QuotaRule:
        """:meth:`set` the rule with ``changes`` (fields of RULE_FIELDS; None removes a
        limit) applied over its stored fields, or over the defaults for a new rule.
        QuotaRuleError names a field that is not a rule's, and every invalid value."""
        unknown = sorted(set(changes) - set(RULE_FIELDS))
        if unknown:
            raise QuotaRuleError(unknown[0], changes[unknown[0]],
                                 f"is not a rule field (one of {', '.join(RULE_FIELDS)})")
        try:
            fields = self.get(rule_id).as_dict()
        except QuotaNotFoundError:
            fields = {}
        fields.update(changes)
        fields.pop("version", None)
        fields["id"] = rule_id
        if "match" not in fields:
            raise QuotaRuleError("match", None, "a new rule needs a match (label=value)")
        return self.set(QuotaRule(**fields), actor=actor)

    def get(self, rule_id: str) -> QuotaRule:
        """The rule in force; QuotaNotFoundError if none."""
        text = self.qs.rule_json(rule_id)
        if text is None:
            raise QuotaNotFoundError(rule_id)
        return QuotaRule.from_json(text)

    def rules(self) -> list[QuotaRule]:
        """Every rule, by id."""
        return sorted(self.keeper.rules(fresh=True).values(), key=lambda r: r.id)

    def delete(self, rule_id: str, *, actor: str | None = None) -> None:
        """Delete a rule (trees stop drawing from it; its windows stay for their
        retention); QuotaNotFoundError if none."""
        self.qs.delete_rule(rule_id, actor or user_at_host())
        self.keeper.revoke(rule_id)
        self.keeper.rules(fresh=True)

    def overview(self) -> dict[str, Any]:
        """Every rule, and every bucket in its current window (the dashboard's JSON)."""
        rules = self.rules()
        return {"rules": [r.as_dict() for r in rules],
                "buckets": [s.as_dict() for r in rules for s in self.status(r)]}

    def report(self, rule_id: str) -> dict[str, Any]:
        """One rule, its buckets now and its audit trail, as ``budgetctl quota show
        --json`` and the dashboard print them; QuotaNotFoundError if none."""
        rule = self.get(rule_id)
        return {"rule": rule.as_dict(), "buckets": [s.as_dict() for s in self.status(rule)],
                "audit": self.audit(rule_id)}

    def audit(self, rule_id: str) -> list[dict[str, str]]:
        """Who changed the rule and how (actor, action, before, after, at: a UTC date),
        oldest first."""
        events = self.qs.audit(rule_id)
        for event in events:
            ts = event.pop("ts", "")
            event["at"] = utc_iso(int(ts)) if ts.isdigit() else ts
        return events

    def status(self, rule: QuotaRule) -> list[QuotaStatus]:
        """The rule's buckets in their current window."""
        now_ms = int(self.coord.store.server_time_ms())
        window = window_at(rule.period, rule.tz, now_ms)
        resets = (window.end_ms - now_ms) / 1000 if window.end_ms else None
        return [QuotaStatus(rule.id, bucket, rule.period, window.id,
                            {d: counters.get(f"s:{d}", 0) for d in DIMS},
                            {d: counters.get(f"g:{d}", 0) for d in DIMS}, dict(rule.limits),
                            resets)
                for bucket, counters in self.qs.window_buckets(rule.id, window.id).items()]

    def history(self, rule: QuotaRule, bucket: str, windows: int = 7
                ) -> dict[str, dict[str, int]]:
        """Window id -> spent by dimension, for the last ``windows`` windows of one bucket
        (the current one last; windows past their retention are gone)."""
        at = int(self.coord.store.server_time_ms())
        out: dict[str, dict[str, int]] = {}
        for _ in range(windows):
            window = window_at(rule.period, rule.tz, at)
            counters = self.qs.bucket_counters(rule.id, bucket, window.id)
            if counters:
                out[window.id] = {d: counters.get(f"s:{d}", 0) for d in DIMS}
            if not window.start_ms:
                break
            at = window.start_ms - 1
        return dict(reversed(out.items()))
