"""The dashboard's pure logic: rows read from context hashes, burn rate and projection,
sort scores, label scopes and alert crossings. No I/O here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.keys import DASH_SORTS
from ..core.labels import LABELS, labels_of
from ..errors import InvalidConfigError
from ..models_base import MAX_USD, in_range
from ..store.approval import APPROVAL_FIELDS, approval_of

SORTS = DASH_SORTS
"""How the overview can be ordered (``age``: newest first): the indexes the store keeps."""
BURN_WINDOW_MS = 60_000
"""Burn rate: USD per minute spent over the last minute (never extrapolated)."""
SAMPLE_EVERY_MS = 10_000
BURN_ALERT_MIN_AGE_MS = 60_000
ROW_FIELDS = ("id", "status", "reason", "detail", "created_ms", "stopped_ms", "closed_ms",
              "meta", "u:usd", "h:usd", "l:usd", "u:steps", "l:steps", "u:retries",
              "u:tin", "u:tout", "depth", "parent", *APPROVAL_FIELDS)
"""The context hash fields a row needs (one HMGET)."""


def _int(h: Mapping[str, Any], name: str) -> int:
    value = h.get(name)
    try:
        return int(value) if value not in (None, "") else 0
    except (TypeError, ValueError):
        return 0


def parse_scope(text: str | None) -> tuple[str, str] | None:
    """``team=research`` -> (``team``, ``research``); None for no filter. Raises
    ValueError for a label the overview cannot filter by."""
    if not text:
        return None
    label, sep, value = text.partition("=")
    if not sep or label not in LABELS or not value:
        raise ValueError(f"filter must be LABEL=VALUE with LABEL one of {', '.join(LABELS)}")
    return label, value


@dataclass(frozen=True)
class Rate:
    """Spend speed of a tree."""

    usd_per_min: float
    """USD per minute over the last minutes (0 when nothing was spent)."""
    minutes_to_ceiling: float | None
    """At that rate, minutes until spend + held reaches the ceiling (None: never/no limit)."""


def burn_rate(samples: Sequence[tuple[int, int]], now_ms: int, used_micro: int,
              created_ms: int) -> float:
    """USD per minute over the burn window: the spend since the window opened, over the
    window's length or, when the baseline is older, the time since the baseline. The
    baseline is the tree's creation (at zero) when it is younger than the window, else
    the last sample taken before the window opened, else the first sample in it. The
    rate is never extrapolated from a shorter span: a tree that spent everything in its
    first second burns that amount per minute for one minute, then nothing."""
    start = now_ms - BURN_WINDOW_MS
    base_ms: int | None = None
    base = 0
    if created_ms >= start:
        base_ms = created_ms
    else:
        for ms, micro in samples:  # oldest first
            if ms <= start or base_ms is None:
                base_ms, base = ms, micro
    if base_ms is None or used_micro <= base:
        return 0.0
    span = max(now_ms - base_ms, BURN_WINDOW_MS)
    return (used_micro - base) / 1e6 / (span / 60_000)


def next_samples(samples: Sequence[tuple[int, int]], now_ms: int, used_micro: int
                 ) -> list[tuple[int, int]] | None:
    """The samples to keep after observing ``used_micro`` at ``now_ms``; None when
    nothing needs writing (the last sample is recent, or spend has not moved)."""
    if samples and (now_ms - samples[-1][0] < SAMPLE_EVERY_MS or samples[-1][1] == used_micro):
        return None
    start = now_ms - BURN_WINDOW_MS
    before = [s for s in samples if s[0] <= start][-1:]
    return [*before, *(s for s in samples if s[0] > start), (now_ms, used_micro)]


def projection(rate: float, limit_micro: int, used_micro: int, held_micro: int) -> Rate:
    """The rate with the minutes left before spend + held reaches the ceiling."""
    if rate <= 0 or limit_micro <= 0:
        return Rate(rate, None)
    left = max(0, limit_micro - used_micro - held_micro) / 1e6
    return Rate(rate, left / rate)


@dataclass(frozen=True)
class Row:
    """One context as the dashboard shows it."""

    id: str
    status: str
    reason: str | None
    detail: str | None
    labels: dict[str, str]
    spend_usd: float
    held_usd: float
    ceiling_usd: float | None
    fraction: float | None
    steps: int
    max_steps: int | None
    retries: int
    tokens_in: int
    tokens_out: int
    created_ms: int
    age_s: float
    """Seconds since creation (whatever the status), as ``budgetctl top`` counts it."""
    depth: int
    parent: str | None
    usd_per_min: float = 0.0
    """USD per minute over the last minute (BURN_WINDOW_MS); 0 unless running."""
    minutes_to_ceiling: float | None = None
    stopped_by: str | None = None
    """The context whose stop this one inherits (itself when it was stopped itself)."""
    waiting_for_approval: dict[str, Any] | None = None
    """A root's wait for approval: ``{ctx, reason, until_ms}`` (None: none, or ended)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def row_from_hash(h: Mapping[str, Any], now_ms: int, rate: float = 0.0,
                  labels: dict[str, str] | None = None) -> Row | None:
    """A row from a context hash (as read with ROW_FIELDS); None for a missing context.
    ``labels``: the context's labels when already parsed from its metadata."""
    if not h.get("status"):
        return None
    used, held, limit = _int(h, "u:usd"), _int(h, "h:usd"), _int(h, "l:usd")
    status = str(h["status"])
    created = _int(h, "created_ms") or now_ms
    # only a running tree burns: a stopped or closed one spends nothing more
    proj = projection(rate, limit, used, held) if status == "running" else Rate(0.0, None)
    return Row(
        id=str(h.get("id") or ""), status=status,
        reason=str(h["reason"]) if status == "stopped" and h.get("reason") else None,
        detail=str(h["detail"]) if status == "stopped" and h.get("detail") else None,
        labels=labels if labels is not None else labels_of(h.get("meta")),
        spend_usd=used / 1e6, held_usd=held / 1e6,
        ceiling_usd=limit / 1e6 if limit else None,
        fraction=used / limit if limit else None,
        steps=_int(h, "u:steps"), max_steps=_int(h, "l:steps") or None,
        retries=_int(h, "u:retries"), tokens_in=_int(h, "u:tin"), tokens_out=_int(h, "u:tout"),
        created_ms=created, age_s=max(0, now_ms - created) / 1000, depth=_int(h, "depth"),
        parent=str(h["parent"]) if h.get("parent") else None,
        usd_per_min=proj.usd_per_min, minutes_to_ceiling=proj.minutes_to_ceiling,
        stopped_by=str(h.get("id")) if status == "stopped" else None,
        waiting_for_approval=_waiting(h, now_ms),
    )


def _waiting(h: Mapping[str, Any], now_ms: int) -> dict[str, Any] | None:
    got = approval_of(h, now_ms)
    return None if got is None else {"ctx": got["approval_ctx"], "reason": got["approval_reason"],
                                     "until_ms": got["approval_until_ms"]}


def sort_scores(row: Row) -> dict[str, float]:
    """The row's score in each sorted index (larger first; ``age``: newer first)."""
    return {"spend": row.spend_usd, "fraction": row.fraction or 0.0,
            "burn": row.usd_per_min, "age": float(row.created_ms)}


def scopes(labels: Mapping[str, str]) -> list[str]:
    """Index scopes a tree belongs to: ``all`` and one ``label=value`` per label."""
    return ["all", *(f"{k}={v}" for k, v in sorted(labels.items()) if k in LABELS)]


@dataclass(frozen=True)
class AlertRule:
    """Thresholds for the roots whose labels match (all roots when ``match`` is empty)."""

    fractions: tuple[float, ...] = (0.5, 0.8, 1.0)
    """Fractions of the root's ceiling (settled spend); each crossing alerts once."""
    burn_usd_per_min: float | None = None
    """A burn rate above which the root alerts once."""
    match: dict[str, str] = field(default_factory=dict)
    """Labels a root must carry for this rule (for example ``{"team": "research"}``)."""

    def __post_init__(self) -> None:
        problems = [{"loc": ("fractions",), "msg": "each must be a number in (0, 1000]",
                     "input": f} for f in self.fractions if not in_range(f, 1e-9, 1000)]
        burn = self.burn_usd_per_min
        if burn is not None and not in_range(burn, 0, MAX_USD):
            problems.append({"loc": ("burn_usd_per_min",), "input": burn,
                             "msg": f"must be a number from 0 to {MAX_USD:g}"})
        if problems:
            raise InvalidConfigError("AlertRule", problems)


@dataclass(frozen=True)
class Alert:
    """One threshold crossed by one context."""

    root: str
    context: str
    threshold: str
    """``fraction:0.8`` or ``burn:2.5``."""
    value: float
    """The observed fraction, or USD per minute."""
    labels: dict[str, str]
    spend_usd: float
    ceiling_usd: float | None
    ts_ms: int
    reason: str | None = None
    """An approval_needed alert's stop waited on (``budget_exceeded``...)."""
    limit: str | None = None
    """An approval_needed alert's limit reached (``max_cost_usd $0.05``)."""
    link: str | None = None
    """An approval_needed alert's tree page (BUDGET_DASHBOARD_URL + ``/trees/<id>``)."""

    @property
    def kind(self) -> str:
        """``fraction``, ``burn`` or ``approval_needed``."""
        return self.threshold.partition(":")[0]

    def message(self) -> str:
        kind, _, level = self.threshold.partition(":")
        who = " ".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or self.root
        if kind == "approval_needed":
            return (f"budget {who}: {self.context} waits for approval ({self.reason}: "
                    f"{self.limit} reached); raise the limit at {self.link}")
        if kind == "fraction":
            return (f"budget {who}: {self.value:.0%} of the ${self.ceiling_usd or 0:.2f} "
                    f"ceiling spent (threshold {float(level):.0%})")
        return f"budget {who}: burning ${self.value:.4f}/min (threshold ${float(level)}/min)"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message()}


def crossings(row: Row, root: str, rules: Sequence[AlertRule], now_ms: int) -> list[Alert]:
    """The alerts ``row`` is due: the highest fraction threshold of the matching rules it
    is at or past (one alert for a jump past several: spend only grows, so the lower
    ones would say less, and later), and each burn threshold it is past."""
    out: dict[str, Alert] = {}
    highest: float | None = None
    for rule in rules:
        if any(row.labels.get(k) != v for k, v in rule.match.items()):
            continue
        if row.fraction is not None:
            for f in rule.fractions:
                if row.fraction >= f - 1e-12 and (highest is None or f > highest):
                    highest = f
        burn = rule.burn_usd_per_min
        # a burn alert waits until the tree is a minute old (its rate covers a minute)
        if (burn is not None and row.age_s * 1000 >= BURN_ALERT_MIN_AGE_MS
                and math.isfinite(row.usd_per_min) and row.usd_per_min >= burn):
            key = f"burn:{burn:g}"
            out[key] = Alert(root, row.id, key, row.usd_per_min, row.labels, row.spend_usd,
                             row.ceiling_usd, now_ms)
    if highest is not None and row.fraction is not None:
        key = f"fraction:{highest:g}"
        out[key] = Alert(root, row.id, key, row.fraction, row.labels, row.spend_usd,
                         row.ceiling_usd, now_ms)
    return list(out.values())
