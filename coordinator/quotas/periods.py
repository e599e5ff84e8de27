"""Quota periods: the window a moment (Redis time) falls in. The window's id is part of
its counters' key, so a new window starts empty by construction (no reset job)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import QuotaRuleError

CALENDAR = ("day", "week", "month")
TOTAL = "total"
_DURATION = re.compile(r"([1-9][0-9]{0,8})(s|m|h|d)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_SPAN_S = 36500 * 86400
"""The longest fixed period and the longest retention (100 years): a window's end and
its keys' expiry stay integers the scripts hold exactly (below 2**53 ms)."""


@dataclass(frozen=True)
class Window:
    """One window of a period: its id (in key names), start and end in Redis ms (end 0:
    never ends)."""

    id: str
    start_ms: int
    end_ms: int


def duration_ms(period: str) -> int | None:
    """A fixed window's length in ms (``30s``, ``5m``, ``2h``, ``1d``), else None."""
    m = _DURATION.fullmatch(period)
    return int(m.group(1)) * _UNIT_MS[m.group(2)] if m else None


def check_period(period: object) -> None:
    if not isinstance(period, str) or not (
            period in CALENDAR or period == TOTAL
            or 0 < (duration_ms(period) or 0) <= MAX_SPAN_S * 1000):
        raise QuotaRuleError("period", period, "must be day, week, month, total or a "
                             "duration such as 30s, 5m, 2h, 1d (at most 36500d)")


def check_tz(tz: object) -> None:
    try:
        if not isinstance(tz, str) or not tz:
            raise ValueError(tz)
        ZoneInfo(tz)
    except (ValueError, ZoneInfoNotFoundError) as exc:
        raise QuotaRuleError("tz", tz, "must be an IANA time zone such as UTC or "
                             "Europe/Paris") from exc


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def window_at(period: str, tz: str, now_ms: int) -> Window:
    """The window of ``period`` (in time zone ``tz``) that ``now_ms`` falls in."""
    if period == TOTAL:
        return Window(TOTAL, 0, 0)
    fixed = duration_ms(period)
    if fixed:
        begin = now_ms - now_ms % fixed
        return Window(f"{period}-{begin // fixed}", begin, begin + fixed)
    zone = ZoneInfo(tz)
    local = datetime.fromtimestamp(now_ms / 1000, timezone.utc).astimezone(zone)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
    if period == "day":
        start, end, wid = day, day + timedelta(days=1), day.strftime("%Y-%m-%d")
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        year, week, _ = start.isocalendar()
        end, wid = start + timedelta(days=7), f"{year}-W{week:02d}"
    else:
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
        wid = start.strftime("%Y-%m")
    # the local midnights, in the zone (a DST change makes a day 23 or 25 hours)
    return Window(wid, _ms(start.replace(tzinfo=zone)), _ms(end.replace(tzinfo=zone)))
