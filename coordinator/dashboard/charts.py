"""The dashboard's charts, drawn on the server as SVG geometry (no script, no CDN): a
tree's spend over time with its ceiling and its stops, an overview sparkline, closed
spend per day by label. Pure: the templates turn these numbers into SVG elements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.durations import human_age

MAX_POINTS = 400
"""A chart draws at most this many points (the last of each slice of time)."""
PALETTE = 7
"""Colour classes ``c0`` .. ``c6`` (the last: every other value)."""


def _fit(series: Sequence[tuple[int, int]], t0: int, t1: int) -> list[tuple[int, int]]:
    """(ms, micro) clamped to [t0, t1], in time order: the first, then the last point of
    each of MAX_POINTS slices of time (spend is cumulative, the last is the truest)."""
    span = max(1, t1 - t0)
    slices: dict[int, tuple[int, int]] = {}
    fitted = [(min(max(ms, t0), t1), micro) for ms, micro in sorted(series)]
    for ms, micro in fitted:
        slices[(ms - t0) * (MAX_POINTS - 1) // span] = (ms, micro)
    kept = [slices[k] for k in sorted(slices)]
    return kept if not fitted or kept[0] == fitted[0] else [fitted[0], *kept]


def _usd(micro: float) -> str:
    usd = micro / 1e6
    if usd == 0:
        return "$0"
    return f"${usd:,.4f}" if abs(usd) < 1 else f"${usd:,.2f}"


def _steps(series: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """A step line through ``series``: each value held until the next reading."""
    out = list(series[:1])
    for ms, micro in series[1:]:
        out += [(ms, out[-1][1]), (ms, micro)] if micro != out[-1][1] else []
    return out


def measured(points: Sequence[tuple[int, int]], calls: Sequence[tuple[int, int]], *,
             created_ms: int, end_ms: int, spend_micro: int) -> list[tuple[int, int]]:
    """(ms, micro-USD) where a tree's spend was known: $0 at its creation; after each of
    its newest recorded ``calls`` (ms at its end, micro-USD it cost), the spend now less
    the calls after it; before the first of those, the indexer's ``points`` (minute,
    micro-USD: read at the latest by the minute's end); ``spend_micro`` at ``end_ms``."""
    exact, after = [], spend_micro
    for ms, cost in sorted(calls, reverse=True):
        exact.append((min(max(ms, created_ms), end_ms), after))
        after = max(0, after - cost)
    first = exact[-1][0] if exact else end_ms
    read = [(m * 60_000 + 59_999, min(u, after)) for m, u in points
            if m * 60_000 + 59_999 < first]
    return [(created_ms, 0), *read, *([(first, after)] if exact else []), *exact[::-1],
            (end_ms, spend_micro)]


def spend_chart(points: Sequence[tuple[int, int]], *, created_ms: int, now_ms: int,
                spend_micro: int, ceiling_micro: int, stops: Sequence[tuple[int, str, str]],
                calls: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """A tree's spend over time as a step line through what was measured (see
    :func:`measured`; never a slope between two readings, so no spend shows where none
    was made, after a stop say); the ceiling as a line; each stop (ms, context, reason)
    as a marker."""
    width, height, left, right, top, bottom = 800, 180, 70, 10, 10, 22
    t0, t1 = created_ms, max(now_ms, created_ms + 1000)
    series = _steps(_fit(measured(points, calls, created_ms=t0, end_ms=t1,
                                  spend_micro=spend_micro), t0, t1))
    peak = max([ceiling_micro, spend_micro, *(u for _, u in series), 1]) * 1.05

    def x(ms: int) -> float:
        return round(left + (ms - t0) / (t1 - t0) * (width - left - right), 1)

    def y(micro: float) -> float:
        return round(top + (1 - micro / peak) * (height - top - bottom), 1)

    last_x, last_y = x(series[-1][0]), y(series[-1][1])
    return {
        "width": width, "height": height, "left": left, "bottom": height - bottom,
        "right": width - right,
        "points": " ".join(f"{x(ms)},{y(u)}" for ms, u in series),
        "ceiling": {"y": y(ceiling_micro), "usd": _usd(ceiling_micro)} if ceiling_micro
        else None,
        "stops": [{"x": x(min(max(ms, t0), t1)), "title": f"{reason} at {ctx}"}
                  for ms, ctx, reason in stops],
        "last": {"x": last_x, "y": last_y, "usd": spend_micro / 1e6},
        "y_labels": [{"y": y(peak / 1.05 * f), "text": _usd(peak / 1.05 * f)}
                     for f in (0.0, 0.5, 1.0)],
        "x_labels": [{"x": x(t0), "text": "created", "anchor": "start"},
                     {"x": x(t1), "text": f"{human_age(t1 - t0)} later", "anchor": "end"}],
    }


def sparkline(points: Sequence[tuple[int, int]], *, created_ms: int, now_ms: int,
              spend_micro: int, span_ms: int = 3_600_000) -> dict[str, Any]:
    """The last ``span_ms`` of a tree's spend (from its points, ending at ``spend_micro``
    now) as a small line scaled to its own range."""
    width, height = 120, 24
    t0 = max(created_ms, now_ms - span_ms)
    t1 = max(now_ms, t0 + 1000)
    start = [(created_ms, 0)] if created_ms >= t0 else []
    before = [(t0, u) for m, u in points if m * 60_000 + 59_999 < t0][-1:]
    inside = [(m * 60_000 + 59_999, u) for m, u in points if m * 60_000 + 59_999 >= t0]
    series = _fit([*start, *before, *inside, (t1, spend_micro)], t0, t1)
    if len(series) == 1:
        series = [(t0, series[0][1]), series[0]]
    low, high = min(u for _, u in series), max(u for _, u in series)
    spread = max(1, high - low)

    def y(micro: int) -> float:
        return round(2 + (1 - (micro - low) / spread) * (height - 4), 1) if high > low \
            else height / 2

    return {"width": width, "height": height,
            "points": " ".join(f"{round((ms - t0) / (t1 - t0) * width, 1)},{y(u)}"
                               for ms, u in series),
            "last": {"x": width, "y": y(series[-1][1]), "usd": spend_micro / 1e6}}


def day_bars(days: Sequence[str], by_day: Mapping[str, Mapping[str, int]],
             totals: Mapping[str, int], label: str) -> dict[str, Any]:
    """Closed spend per day, one stacked bar a day as tall as the day's total: the
    label's biggest values (over the days shown) each in its colour, its other values
    together, and the trees without that label (the unlabelled ones among them)."""
    width, height, left, bottom = 800, 160, 70, 20
    sums: dict[str, int] = {}
    for day in days:
        for value, micro in by_day.get(day, {}).items():
            sums[value] = sums.get(value, 0) + micro
    named = [v for v, _ in sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))]
    named = named[:PALETTE - 1]
    peak = max([totals.get(d, 0) for d in days] + [1])
    slot = (width - left) / max(1, len(days))
    bars = []
    for i, day in enumerate(days):
        row = by_day.get(day, {})
        parts = [(v, f"c{n}", row.get(v, 0)) for n, v in enumerate(named)]
        parts.append((f"other {label}s", f"c{PALETTE - 1}",
                      sum(u for v, u in row.items() if v not in named)))
        parts.append((f"no {label}", "unlabelled", totals.get(day, 0) - sum(row.values())))
        base, segments = float(height - bottom), []
        for value, cls, micro in parts:
            if micro <= 0:
                continue
            h = round(micro / peak * (height - bottom - 10), 1)
            base -= h
            segments.append({"y": round(base, 1), "h": h, "cls": cls,
                             "title": f"{day} {value}: {_usd(micro)}"})
        bars.append({"x": round(left + i * slot + 2, 1), "w": round(max(1.0, slot - 4), 1),
                     "day": day, "label": day[5:], "usd": totals.get(day, 0) / 1e6,
                     "segments": segments})
    legend = [(v, f"c{n}") for n, v in enumerate(named)]
    return {"width": width, "height": height, "left": left, "bottom": height - bottom,
            "bars": bars, "peak": _usd(peak),
            "legend": [*legend, (f"other {label}s", f"c{PALETTE - 1}"),
                       (f"no {label}", "unlabelled")]}
