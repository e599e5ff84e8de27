"""Stored numbers read the way lua/lib/numbers.lua's ``stored_num`` reads them (its Python twin):
a canonical decimal integer or corrupt; context hashes made readable for snapshots."""

from __future__ import annotations

import re
from collections.abc import Mapping

_NUMERIC = re.compile(r"^(?:[luh]:|deadline$|created_ms$|stopped_ms$|closed_ms$|depth$)")
_CANONICAL = re.compile(r"(?:0|[1-9][0-9]{0,15})")
MAX_EXACT = 2 ** 53
"""Integers from here on are not exact in Lua: stored at or above it, a number is corrupt."""


def canonical_int(value: str | None) -> int | None:
    """The integer a stored field holds when it is written as the project writes one
    (digits only, no sign, no leading zero, below 2**53), else None (corrupt)."""
    if value is None or not _CANONICAL.fullmatch(value):
        return None
    n = int(value)
    return n if n < MAX_EXACT else None


def is_numeric_field(field: str) -> bool:
    """Whether the scripts read ``field`` of a context hash as a number."""
    return _NUMERIC.match(field) is not None


def corrupt_fields(h: Mapping[str, str]) -> dict[str, str]:
    """The numeric fields of a context hash whose value is not canonical, with it."""
    return {k: v for k, v in h.items() if is_numeric_field(k) and canonical_int(v) is None}


def readable(h: Mapping[str, str]) -> dict[str, str]:
    """``h`` with every limit, counter, deadline or time field that is not a canonical
    integer read as ``"0"``: a snapshot of a corrupt context still renders (its status
    says ``state_corrupt`` once a script has met the field), and a corrupt limit reads as
    no budget left, never as no limit."""
    bad = corrupt_fields(h)
    return {k: ("0" if k in bad else v) for k, v in h.items()}
