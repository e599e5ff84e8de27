"""Who acts, when a change or an action does not say: ``user@host`` of this process (kept
in the audit of a quota rule and in the events of budgetctl's actions)."""

from __future__ import annotations

import getpass
import socket


def user_at_host() -> str:
    """``user@host`` of this process (``unknown@host`` when the user has no name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
