"""Durations, ages and times as a person reads them, one format for the CLI and the
dashboard."""

from __future__ import annotations

from datetime import datetime, timezone


def human_age(ms: int | float) -> str:
    """A duration for a person: ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    s = int(max(0, ms)) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def utc_iso(ms: int | float) -> str:
    """A time in milliseconds since the epoch as a UTC date: ``2026-11-28T07:10:00.123Z``."""
    at = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
