"""Who may see and do what: configured users and bearer tokens, their roles (viewer,
operator) and tenant, password checks, and CSRF tokens. No I/O here."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

ROLES = ("viewer", "operator")
PBKDF2_ITERATIONS = 200_000


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    role: str
    tenant: str | None = None
    """The only tenant this caller may see (None: every tenant the dashboard serves)."""
    via: str = "session"
    """``session`` (cookie: actions need a CSRF token) or ``bearer``."""

    @property
    def operator(self) -> bool:
        return self.role == "operator"

    def may_see(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


@dataclass(frozen=True)
class _Credential:
    principal: Principal
    secret: str = field(repr=False)
    """A plain password, or ``pbkdf2_sha256$iterations$salt$hex``."""


def hash_password(password: str, *, salt: str | None = None,
                  iterations: int = PBKDF2_ITERATIONS) -> str:
    """A ``pbkdf2_sha256$...`` string for BUDGET_DASHBOARD_USERS."""
    salt = salt or secrets.token_hex(8)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"pbkdf2_sha256${iterations}${salt}${digest.hex()}"


def _matches(stored: str, given: str) -> bool:
    if stored.startswith("pbkdf2_sha256$"):
        try:
            _, iterations, salt, _hex = stored.split("$")
            again = hash_password(given, salt=salt, iterations=int(iterations))
        except ValueError:
            return False
        return hmac.compare_digest(again, stored)
    return hmac.compare_digest(stored.encode(), given.encode())


_PBKDF2 = re.compile(r"pbkdf2_sha256\$[1-9][0-9]*\$[^$]+\$[0-9a-f]{64}")


def _checked_secret(user: str, secret: str) -> str:
    """``secret``, unless it starts like a hash and is not a whole one (a shell expanded
    its ``$`` parts inside double quotes): then logins could never succeed."""
    if secret.lower().startswith("pbkdf2") and not _PBKDF2.fullmatch(secret):
        raise ValueError(
            f"BUDGET_DASHBOARD_USERS: the password of user {user!r} looks like a broken "
            "pbkdf2_sha256 hash (expected pbkdf2_sha256$ITERATIONS$SALT$HEX; a shell "
            "expands the $ parts inside double quotes): put the value in single quotes")
    return secret


def _role_tenant(text: str, where: str) -> tuple[str, str | None]:
    role, _, tenant = text.partition("@")
    if role not in ROLES:
        raise ValueError(f"{where}: role must be one of {ROLES}, got {role!r}")
    return role, tenant or None


@dataclass(frozen=True)
class Auth:
    """The configured credentials. Empty: nobody logs in, pages are open (allowed on
    127.0.0.1 only) and every action is refused."""

    users: dict[str, _Credential] = field(default_factory=dict, repr=False)
    tokens: tuple[_Credential, ...] = field(default=(), repr=False)
    secret_key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    """Signs the session cookie (``BUDGET_DASHBOARD_SECRET``; random per process else)."""
    secure_cookie: bool = False
    """Send the session cookie over HTTPS only (``BUDGET_DASHBOARD_SECURE_COOKIE=1``)."""

    @property
    def configured(self) -> bool:
        return bool(self.users or self.tokens)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Auth:
        """``BUDGET_DASHBOARD_USERS="alice:operator:pw,bob:viewer@acme:pw2"`` (the
        password last; a ``pbkdf2_sha256$...`` hash from :func:`hash_password` instead of
        a plain one is recommended), ``BUDGET_DASHBOARD_TOKENS="operator:tok1,
        viewer@acme:tok2"`` for API clients (``Authorization: Bearer tok1``), and
        ``BUDGET_DASHBOARD_SECRET``. ``role@tenant`` binds to one tenant."""
        env = os.environ if env is None else env
        return cls.parse(env.get("BUDGET_DASHBOARD_USERS", ""),
                         env.get("BUDGET_DASHBOARD_TOKENS", ""),
                         env.get("BUDGET_DASHBOARD_SECRET") or None,
                         secure_cookie=env.get("BUDGET_DASHBOARD_SECURE_COOKIE") == "1")

    @classmethod
    def parse(cls, users: str = "", tokens: str = "", secret_key: str | None = None, *,
              secure_cookie: bool = False) -> Auth:
        """Credentials from the two specification strings (see :meth:`from_env`)."""
        parsed: dict[str, _Credential] = {}
        for i, spec in enumerate(s for s in users.split(",") if s.strip()):
            parts = spec.strip().split(":", 2)
            if len(parts) != 3 or not parts[0] or not parts[2]:
                raise ValueError(f"BUDGET_DASHBOARD_USERS entry {i + 1}: "
                                 "expected name:role[@tenant]:password")
            role, tenant = _role_tenant(parts[1], f"user {parts[0]!r}")
            parsed[parts[0]] = _Credential(Principal(parts[0], role, tenant),
                                           _checked_secret(parts[0], parts[2]))
        creds = []
        for i, spec in enumerate(s for s in tokens.split(",") if s.strip()):
            head, sep, token = spec.strip().partition(":")
            if not sep or len(token) < 16:
                raise ValueError(f"BUDGET_DASHBOARD_TOKENS entry {i + 1}: expected "
                                 "role[@tenant]:token with a token of 16 characters or more")
            role, tenant = _role_tenant(head, f"token {i + 1}")
            creds.append(_Credential(Principal(f"token-{i + 1}", role, tenant, "bearer"), token))
        return cls(parsed, tuple(creds), secret_key or secrets.token_hex(32), secure_cookie)

    def login(self, name: str, password: str) -> Principal | None:
        cred = self.users.get(name)
        if cred is None:
            return None
        return cred.principal if _matches(cred.secret, password) else None

    def bearer(self, header: str | None) -> Principal | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        given = header[7:].strip()
        found = None
        for cred in self.tokens:  # compare with every token: no early exit to time
            if hmac.compare_digest(cred.secret.encode(), given.encode()):
                found = cred.principal
        return found

    def session_user(self, session: Mapping[str, object]) -> Principal | None:
        name = session.get("user")
        cred = self.users.get(name) if isinstance(name, str) else None
        return cred.principal if cred is not None else None


class LoginThrottle:
    """Refuses a user name for a while after repeated failed logins (in this process):
    ``attempts`` failures within ``window_s`` lock it for the rest of the window."""

    def __init__(self, attempts: int = 5, window_s: float = 60.0) -> None:
        self.attempts = attempts
        self.window_s = window_s
        self._failures: dict[str, list[float]] = {}

    def locked(self, name: str, now: float) -> bool:
        recent = [t for t in self._failures.get(name, []) if now - t < self.window_s]
        self._failures[name] = recent
        if not recent:
            self._failures.pop(name, None)
        return len(recent) >= self.attempts

    def failed(self, name: str, now: float) -> None:
        if len(self._failures) > 10_000:  # names tried once, long ago: forget them
            self._failures = {k: v for k, v in self._failures.items()
                              if v and now - v[-1] < self.window_s}
        self._failures.setdefault(name, []).append(now)

    def succeeded(self, name: str) -> None:
        self._failures.pop(name, None)


def csrf_token(session: dict[str, object]) -> str:
    """The session's CSRF token (created on first use)."""
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(24)
        session["csrf"] = token
    return token


def csrf_ok(session: Mapping[str, object], given: str | None) -> bool:
    token = session.get("csrf")
    return isinstance(token, str) and bool(given) and hmac.compare_digest(
        token.encode(), (given or "").encode())
