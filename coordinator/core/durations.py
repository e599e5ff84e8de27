"""Durations and ages as a person reads them, one format for the CLI and the dashboard."""

from __future__ import annotations


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
