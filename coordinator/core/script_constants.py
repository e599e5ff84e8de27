"""Constants shared by the Python side and the Lua scripts, defined once here: the store
renders them into the prelude of every script it registers (see store/scripts.py), so a
script reads ``HOOK`` or ``EVENT_STREAM_CAP`` instead of repeating the literal."""

from __future__ import annotations

HOOK = "ExecutionContext"
"""The ``hook`` of the SafetyEvents the core itself records (stops, summaries)."""

EVENT_STREAM_CAP = 10_000
"""Length cap of a context's event list (lua/lib/common.lua append_capped: trimmed to it once past
it by a tenth) and approximate MAXLEN of a tree's ledger stream."""

NODE_STREAM_CAP = 10_000
"""Length cap of a context's node-record list (passed to settle and release in ARGV)."""

LUA_CONSTANTS: dict[str, str | int] = {
    "HOOK": HOOK,
    "EVENT_STREAM_CAP": EVENT_STREAM_CAP,
}
"""The constants every script sees as Lua locals of the same name."""
