"""Readable context hashes: the Python twin of lua/lib.lua's ``stored_num`` for reads."""

from __future__ import annotations

import re
from collections.abc import Mapping

_NUMERIC = re.compile(r"^(?:[luh]:|deadline$|created_ms$|stopped_ms$|closed_ms$|depth$)")
_INTEGER = re.compile(r"^[0-9]{1,16}$")


def readable(h: Mapping[str, str]) -> dict[str, str]:
    """``h`` with every limit, counter, deadline or time field that is not a valid
    non-negative integer read as ``"0"``: a snapshot of a corrupt context still renders
    (its status says ``state_corrupt`` once a script has met the field), and a corrupt
    limit reads as no budget left, never as no limit."""
    return {k: ("0" if _NUMERIC.match(k) and not _INTEGER.match(v) else v)
            for k, v in h.items()}
