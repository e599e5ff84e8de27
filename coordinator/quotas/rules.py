"""Quota rules: which trees a rule matches (labels, ``*`` meaning each value separately),
its limits per period, and their validation (every number checked, typed errors)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import QuotaRuleError
from ..models import ChainMetadata
from .periods import MAX_SPAN_S, check_period, check_tz

RULE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_EXACT = 2 ** 53
"""Integers from here up are not exact in Lua (and a float cannot hold every one)."""
MAX_USD = (MAX_EXACT - 1) / 1_000_000
WILDCARD = "*"
DIMS = ("usd", "calls", "tok")
"""A quota's dimensions: micro-USD, calls (each call that ran), tokens (input + output)."""
DEFAULT_RETENTION_S = 90 * 86400
DEFAULT_GRANT_FRACTION = 0.05


def _check_usd(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise QuotaRuleError("usd", value, "must be a number of dollars")
    if isinstance(value, float) and not math.isfinite(value):  # (an int of any size is)
        raise QuotaRuleError("usd", value, "must be finite (not NaN or infinite)")
    if value < 0:
        raise QuotaRuleError("usd", value, "must not be negative")
    if value > MAX_USD:
        raise QuotaRuleError("usd", value, f"must be at most {MAX_USD:.0f} (exact in "
                             "micro-dollars)")
    return round(value * 1_000_000)


def _check_count(name: str, value: object, most: int = MAX_EXACT - 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and not math.isinf(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuotaRuleError(name, value, "must be a whole number")
    if value < 0:
        raise QuotaRuleError(name, value, "must not be negative")
    if value > most:
        raise QuotaRuleError(name, value, f"must be below 2**53 ({MAX_EXACT})"
                             if most == MAX_EXACT - 1 else f"must be at most {most}")
    return value


def _check_match(match: object) -> dict[str, str]:
    if not isinstance(match, Mapping) or not match:
        raise QuotaRuleError("match", match, "must name at least one label=value "
                             "(value * for each value separately)")
    out: dict[str, str] = {}
    for label, value in match.items():
        if not isinstance(label, str) or not LABEL.match(label):
            raise QuotaRuleError("match", label, f"a label must match {LABEL.pattern}")
        if not isinstance(value, str) or not value or len(value) > 256 or any(
                c in value for c in "\n|{}"):
            raise QuotaRuleError("match", value, "a value must be a non-empty string "
                                 "(no newline, '|', braces) or *")
        out[label] = value
    return out


@dataclass(frozen=True)
class QuotaRule:
    """A standing budget. ``match`` maps labels (``org``, ``team``, ``service``,
    ``user``, ``key`` or any tag name) to a value, or ``*`` for each value separately;
    the limits (at least one) hold per ``period``: ``day``, ``week``, ``month``
    (calendar, in ``tz``), ``total``, or a fixed window such as ``30s``, ``5m``, ``1h``."""

    id: str
    match: dict[str, str]
    usd: float | None = None
    """Dollars per period (None: not limited)."""
    tokens: int | None = None
    """Input + output tokens per period."""
    calls: int | None = None
    """Calls per period (each call that ran, completed or failed)."""
    period: str = "day"
    tz: str = "UTC"
    retention_s: int = DEFAULT_RETENTION_S
    """How long a bucket's window is kept after it ends (its history)."""
    grant_fraction: float = DEFAULT_GRANT_FRACTION
    """The most a tree takes at once, as a fraction of the limit (less near the limit)."""
    version: int = 0
    """Set by the store: increases with every change."""
    limits: dict[str, int] = field(init=False, compare=False)
    """The limits by dimension, in integers (micro-USD, calls, tokens)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not RULE_ID.match(self.id):
            raise QuotaRuleError("id", self.id, f"must match {RULE_ID.pattern}")
        object.__setattr__(self, "match", _check_match(self.match))
        limits = {"usd": _check_usd(self.usd), "calls": _check_count("calls", self.calls),
                  "tok": _check_count("tokens", self.tokens)}
        set_limits = {k: v for k, v in limits.items() if v is not None}
        if not set_limits:
            raise QuotaRuleError("limits", None, "at least one of usd, tokens, calls")
        object.__setattr__(self, "limits", set_limits)
        check_period(self.period)
        check_tz(self.tz)
        retention = _check_count("retention_s", self.retention_s, MAX_SPAN_S)
        if not retention:
            raise QuotaRuleError("retention_s", self.retention_s, "must be at least 1")
        g = self.grant_fraction
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g <= 1:
            raise QuotaRuleError("grant_fraction", g, "must be a number in (0, 1]")

    def bucket_of(self, labels: Mapping[str, str]) -> str | None:
        """The bucket a tree with ``labels`` draws from (``team=research,user=ann``),
        or None when the rule does not match it."""
        parts = []
        for label, want in sorted(self.match.items()):
            have = labels.get(label)
            if not have or (want != WILDCARD and have != want):
                return None
            parts.append(f"{label}={_escaped(have)}")
        return ",".join(parts)

    def grant_want(self, dim: str) -> int:
        """The most a tree asks for at once in ``dim``."""
        return max(1, math.ceil(self.limits[dim] * self.grant_fraction))

    def as_dict(self) -> dict[str, Any]:
        """The rule's fields (what ``QuotaRule(**fields)`` takes)."""
        return {"id": self.id, "match": dict(self.match), "usd": self.usd,
                "tokens": self.tokens, "calls": self.calls, "period": self.period,
                "tz": self.tz, "retention_s": self.retention_s,
                "grant_fraction": self.grant_fraction, "version": self.version}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> QuotaRule:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)


RULE_FIELDS = ("match", "usd", "tokens", "calls", "period", "tz", "retention_s",
               "grant_fraction")
"""What a change to a rule may set (its id names it; the store sets its version)."""


def match_from_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["team=research", "user=*"]`` as a match; QuotaRuleError for a pair without '='."""
    out = {}
    for pair in pairs:
        label, sep, value = pair.partition("=")
        if not sep:
            raise QuotaRuleError("match", pair, "takes label=value (value * for each value "
                                 "separately)")
        out[label.strip()] = value.strip()
    return out


def _escaped(value: str) -> str:
    """A label value as a bucket name holds it: '%', '|' and ',' percent-encoded (a grant's
    member joins bucket, window and root with '|'; a bucket joins labels with ',')."""
    return value.replace("%", "%25").replace("|", "%7C").replace(",", "%2C")


def labels_of(meta: ChainMetadata) -> dict[str, str]:
    """The labels rules match a tree by: its tags, then org, team, service, user."""
    labels = {str(k): str(v) for k, v in meta.tags.items()}
    for name, value in (("org", meta.org_id), ("team", meta.team),
                        ("service", meta.service), ("user", meta.user_id)):
        if value:
            labels[name] = value
    return labels
