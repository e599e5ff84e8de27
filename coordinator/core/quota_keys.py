"""Key names of quotas (docs/quotas.md). A rule's keys share the hash tag ``{qr:<rule>}``
(one slot per rule, apart from every tree's); the catalogue of rules is one hash per
tenant."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import KeySpace


@dataclass(frozen=True)
class QuotaKeys:
    """Quota keys of one tenant's key space."""

    ks: KeySpace

    def catalogue(self) -> str:
        """Hash: rule id -> the rule's JSON (what matching and listing read)."""
        return f"{self.ks.prefix}:quotas"

    def _tag(self, rule_id: str) -> str:
        return f"{self.ks.prefix}:{{qr:{rule_id}}}"

    def rule(self, rule_id: str) -> str:
        """Hash: the rule in force (``v`` version, ``l:<dim>`` limits, ``def`` JSON)."""
        return f"{self._tag(rule_id)}:rule"

    def audit(self, rule_id: str) -> str:
        """Stream: who changed the rule, and how."""
        return f"{self._tag(rule_id)}:audit"

    def bucket(self, rule_id: str, bucket: str, window: str) -> str:
        """Hash: one bucket's window: ``s:<dim>`` spent, ``g:<dim>`` held in grants."""
        return f"{self._tag(rule_id)}:b:{window}:{bucket}"

    def window_index(self, rule_id: str, window: str) -> str:
        """Set: the buckets of one window that trees drew from (expires with them)."""
        return f"{self._tag(rule_id)}:w:{window}"

    def grants(self, rule_id: str) -> str:
        """Hash: grant member (bucket, window, root) -> its record (JSON)."""
        return f"{self._tag(rule_id)}:grants"

    def expiry(self, rule_id: str) -> str:
        """Zset: grant member -> lease expiry (Redis ms), renewed while a holder lives."""
        return f"{self._tag(rule_id)}:expiry"

    def takers(self, rule_id: str, bucket: str, window: str) -> str:
        """Zset: trees that asked a bucket's window for a grant lately (grants shrink with
        their number); expires on its own."""
        return f"{self._tag(rule_id)}:takers:{window}:{bucket}"
