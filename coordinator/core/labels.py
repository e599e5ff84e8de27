"""A tree's labels, read from its ChainMetadata as stored (JSON in the context hash)."""

from __future__ import annotations

import json

LABELS = ("org", "team", "service", "user")
"""Labels a tree can be filtered by (from its ChainMetadata)."""
_META_NAMES = {"org": "org_id", "team": "team", "service": "service", "user": "user_id"}


def labels_of(meta_json: str | None) -> dict[str, str]:
    """The labels of a context's metadata JSON (empty ones, and unreadable JSON, left
    out)."""
    try:
        meta = json.loads(meta_json or "{}")
    except ValueError:
        return {}
    if not isinstance(meta, dict):
        return {}
    out = {}
    for label, name in _META_NAMES.items():
        value = meta.get(name)
        if isinstance(value, str) and value:
            out[label] = value
    return out
