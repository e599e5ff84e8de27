"""The context token: a compact, versioned, signed, header-safe string naming a context.

Format (version 1)::

    base64url(msgpack([1, kid, root, context, path, tenant, issued, expires]))
    + "." + base64url(HMAC-SHA256(secret[kid], payload bytes))

``path`` lists the ancestor ids, root first, ending with ``context``; times are Unix
seconds. Limits are never in the token: it names a context, it cannot raise a limit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from .errors import (
    TenantMismatchError,
    TokenExpiredError,
    TokenMalformedError,
    TokenSignatureError,
    TokenTooLargeError,
    TokenVersionError,
    UnknownKeyError,
)

VERSION = 1
MAX_TOKEN_BYTES = 4096
CLOCK_SKEW_S = 60


@dataclass(frozen=True)
class TokenClaims:
    """What a verified token says."""

    root: str
    context: str
    path: tuple[str, ...]
    tenant: str
    issued: int
    expires: int
    kid: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _B64_ALPHABET for c in text):
        raise TokenMalformedError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenMalformedError("not base64url") from None


_B64_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def parse_keys(spec: str) -> dict[str, bytes]:
    """Parse ``kid:secret,kid2:secret2`` (the first signs, all verify)."""
    keys: dict[str, bytes] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kid, sep, secret = part.partition(":")
        if not sep or not kid or len(secret) < 16:
            raise ValueError(
                "BUDGET_TOKEN_KEYS must be 'kid:secret' pairs separated by commas, "
                "each secret at least 16 characters"
            )
        keys[kid] = secret.encode()
    if not keys:
        raise ValueError("BUDGET_TOKEN_KEYS names no key")
    return keys


class TokenCodec:
    """Signs and verifies context tokens with a key ring (first key signs)."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise ValueError("a token codec needs at least one key")
        self._keys = dict(keys)
        self._signing_kid = next(iter(self._keys))

    def encode(
        self, *, root: str, path: tuple[str, ...], tenant: str, ttl_s: int, now: float
    ) -> str:
        """A signed token naming ``path[-1]`` in the tree ``root``."""
        issued = int(now)
        payload = msgpack.packb(
            [VERSION, self._signing_kid, root, path[-1], list(path), tenant, issued,
             issued + max(1, ttl_s)]
        )
        sig = hmac.new(self._keys[self._signing_kid], payload, hashlib.sha256).digest()
        return f"{_b64(payload)}.{_b64(sig)}"

    def decode(self, token: object, *, now: float, tenant: str | None = None) -> TokenClaims:
        """Verify and parse a token. Raises a :class:`~coordinator.errors.TokenError`
        subclass for anything wrong; never anything else."""
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise TokenMalformedError("not ASCII") from None
        if not isinstance(token, str):
            raise TokenMalformedError(f"expected a string, got {type(token).__name__}")
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenTooLargeError(len(token), MAX_TOKEN_BYTES)
        body, sep, sig_text = token.partition(".")
        if not sep or "." in sig_text:
            raise TokenMalformedError("expected payload.signature")
        payload, sig = _unb64(body), _unb64(sig_text)
        try:
            fields = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        except Exception:  # msgpack raises many types on garbage  # noqa: BLE001
            raise TokenMalformedError("payload is not msgpack") from None
        if not isinstance(fields, list) or not fields:
            raise TokenMalformedError("payload is not a token")
        if fields[0] != VERSION:
            raise TokenVersionError(f"version {fields[0]!r} is not {VERSION}")
        if len(fields) != 8:
            raise TokenMalformedError("wrong number of fields")
        _, kid, root, ctx, path, ten, issued, expires = fields
        if not isinstance(kid, str) or kid not in self._keys:
            raise UnknownKeyError(f"unknown key id {kid!r}")
        want = hmac.new(self._keys[kid], payload, hashlib.sha256).digest()
        if not hmac.compare_digest(want, sig):
            raise TokenSignatureError("signature mismatch")
        if not (
            isinstance(root, str) and isinstance(ctx, str) and isinstance(ten, str)
            and isinstance(path, list) and path and all(isinstance(p, str) for p in path)
            and path[0] == root and path[-1] == ctx
            and isinstance(issued, int) and isinstance(expires, int)
        ):
            raise TokenMalformedError("fields of the wrong type")
        if now > expires + CLOCK_SKEW_S:
            raise TokenExpiredError(f"expired {int(now - expires)} s ago")
        if tenant is not None and ten != tenant:
            raise TenantMismatchError(f"token tenant {ten!r} is not {tenant!r}")
        return TokenClaims(root, ctx, tuple(path), ten, issued, expires, kid)


def now_s() -> float:
    return time.time()
