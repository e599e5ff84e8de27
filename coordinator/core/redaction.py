"""Secrets out of what is shown: a URL's password (and any password in its query) becomes
``**`` wherever a URL is printed, logged or returned (errors, ``repr``, the CLI, the
dashboard, metrics labels)."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/?#]*):"
                       r"(?P<secret>[^@/?#]*)@")
_QUERY_SECRET = re.compile(r"(?P<name>[?&](?:[A-Za-z_]*password|token|secret)=)[^&#]*",
                           re.IGNORECASE)
MASK = "**"


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``**``:
    ``redis://:secret@h:6379/0`` -> ``redis://:**@h:6379/0``, ``redis://u:secret@h`` ->
    ``redis://u:**@h``, ``...?sentinel_password=secret`` -> ``...?sentinel_password=**``.
    A URL with a user and no password (``redis://secret@h``, the password-only form of
    some clients) has that part masked too. Works on a message containing URLs."""
    masked = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    masked = re.sub(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^:@/?#\s]+@(?!\*)",
                    lambda m: f"{m['scheme']}{MASK}@", masked)
    return _QUERY_SECRET.sub(lambda m: f"{m['name']}{MASK}", masked)
