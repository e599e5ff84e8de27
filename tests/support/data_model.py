"""A pure-Python model of the merge policies of context data, to check what Redis did."""

from __future__ import annotations

import json
from typing import Any


def deep_merge(parent: Any, child: Any) -> Any:
    """Maps merged key by key recursively, lists concatenated, otherwise the child's."""
    if isinstance(parent, dict) and isinstance(child, dict):
        out = dict(parent)
        for k, v in child.items():
            out[k] = deep_merge(out[k], v) if k in out else v
        return out
    if isinstance(parent, list) and isinstance(child, list):
        return parent + child
    return child


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


def apply_merge(parent: dict[str, Any], child: dict[str, Any], policy: str,
                keys: list[str] | None = None
                ) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The parent's data after merging ``child`` into it, and what changed."""
    out = dict(parent)
    changes: dict[str, list[str]] = {"added": [], "overwritten": [], "merged": []}
    for k in sorted(keys if keys is not None else child):
        if k not in child:
            continue
        if k not in out:
            out[k] = child[k]
            changes["added"].append(k)
        elif policy == "overwrite" and not _same(out[k], child[k]):
            out[k] = child[k]
            changes["overwritten"].append(k)
        elif policy == "merge":
            merged = deep_merge(out[k], child[k])
            if not _same(merged, out[k]):
                out[k] = merged
                changes["merged"].append(k)
    return out, changes
