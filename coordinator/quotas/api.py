"""The quota API (what ``budgetctl quota`` and the dashboard call): set, read, list and
delete rules at runtime, each change audited and applied to the next call of every tree;
the state of each bucket's window."""

from __future__ import annotations

import dataclasses
import getpass
import socket
from dataclasses import dataclass

from ..errors import QuotaNotFoundError
from ..runtime.coordinator import Coordinator
from .keeper import keeper_of
from .periods import window_at
from .rules import DIMS, QuotaRule


def default_actor() -> str:
    """Who is changing a rule, when not said: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


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
                                   actor or default_actor())
        self.keeper.revoke(rule.id)
        self.keeper.rules(fresh=True)
        return dataclasses.replace(rule, version=version)

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
        self.qs.delete_rule(rule_id, actor or default_actor())
        self.keeper.revoke(rule_id)
        self.keeper.rules(fresh=True)

    def audit(self, rule_id: str) -> list[dict[str, str]]:
        """Who changed the rule and how (actor, action, before, after, ts), oldest first."""
        return self.qs.audit(rule_id)

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
