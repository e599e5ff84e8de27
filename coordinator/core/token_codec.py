"""The context token: a compact, versioned, signed, header-safe string naming a context.

Format (version 1)::

    base64url(msgpack([1, kid, root, context, path, tenant, issued, expires]))
    + "." + base64url(HMAC-SHA256(secret[kid], payload bytes))

``path`` lists the ancestor ids, root first, ending with ``context``; times are Unix
seconds. Limits are never in the token: it names a context, it cannot raise a limit.
Base64url is unpadded and must be canonical, so one token has exactly one spelling.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import (
    TenantMismatchError,
    TokenExpiredError,
    TokenMalformedError,
    TokenNotYetValidError,
    TokenSignatureError,
    TokenTooLargeError,
    TokenVersionError,
    UnknownKeyError,
)
from .durations import human_age

VERSION = 1
_VERIFIED_CACHE = 1024
MAX_TOKEN_BYTES = 4096
CLOCK_SKEW_S = 60
MIN_SECRET_BYTES = 16
_SIG_BYTES = hashlib.sha256().digest_size
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


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
    if not _B64URL.fullmatch(text):
        raise TokenMalformedError("not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenMalformedError("not base64url") from None
    # The decoder ignores unused low bits of the last character; without this check a
    # token would have several spellings that all verify.
    if _b64(data) != text:
        raise TokenMalformedError("not canonical base64url")
    return data


def _short(value: object) -> str:
    """An attacker-supplied value, clipped for error messages."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_keys(spec: str) -> dict[str, bytes]:
    """Parse ``kid:secret,kid2:secret2`` (the first signs, all verify)."""
    keys: dict[str, bytes] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kid, sep, secret = part.partition(":")
        kid = kid.strip()
        if not sep or not kid or len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                "BUDGET_TOKEN_KEYS must be 'kid:secret' pairs separated by commas, "
                f"each secret at least {MIN_SECRET_BYTES} bytes"
            )
        if kid in keys:
            raise ValueError(f"BUDGET_TOKEN_KEYS names the key id {kid!r} twice")
        keys[kid] = secret.encode()
    if not keys:
        raise ValueError("BUDGET_TOKEN_KEYS names no key")
    return keys


def token_size(path: tuple[str, ...], tenant: str, kid: str) -> int:
    """The length of the token naming ``path[-1]`` (issue and expiry times of any date
    before 2106), without signing it: what :meth:`TokenCodec.encode` would produce."""
    stamp = 2**32 - 1  # the widest Unix time msgpack packs in 5 bytes
    payload = msgpack.packb([VERSION, kid, path[0], path[-1], list(path), tenant,
                             stamp, stamp])
    return len(_b64(payload)) + 1 + len(_b64(bytes(_SIG_BYTES)))


class TokenCodec:
    """Signs and verifies context tokens with a key ring (first key signs, all verify)."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not keys:
            raise ValueError("a token codec needs at least one key")
        for kid, secret in keys.items():
            if not kid or not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"token key {kid!r} must be a secret of at least "
                                 f"{MIN_SECRET_BYTES} bytes")
        self._keys = dict(keys)
        self._signing_kid = next(iter(self._keys))
        # Tokens already verified (fan-out children all carry their parent's token);
        # bounded, oldest out first.
        self._verified: dict[str, TokenClaims] = {}
        self._verified_lock = threading.Lock()

    @property
    def signing_kid(self) -> str:
        """The key id new tokens are signed with."""
        return self._signing_kid

    def encode(
        self, *, root: str, path: tuple[str, ...], tenant: str, ttl_s: int, now: float
    ) -> str:
        """A signed token naming ``path[-1]`` in the tree ``root``. Raises
        :class:`~coordinator.errors.TokenTooLargeError` rather than issue a token that
        no receiver would accept."""
        if not path or path[0] != root or len(set(path)) != len(path):
            raise ValueError(f"path {path!r} must start at the root {root!r}, without repeats")
        issued = int(now)
        payload = msgpack.packb(
            [VERSION, self._signing_kid, root, path[-1], list(path), tenant, issued,
             issued + max(1, ttl_s)]
        )
        sig = hmac.digest(self._keys[self._signing_kid], payload, "sha256")
        token = f"{_b64(payload)}.{_b64(sig)}"
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenTooLargeError(len(token), MAX_TOKEN_BYTES)
        return token

    def decode(self, token: object, *, now: float, tenant: str | None = None) -> TokenClaims:
        """Verify and parse a token. Raises a :class:`~coordinator.errors.TokenError`
        subclass for anything wrong; never anything else.

        The signature is checked before any claim is trusted; the tenant last, so a
        403 is only ever answered to a genuine token of another tenant."""
        if isinstance(token, (bytes, bytearray, memoryview)):
            raw = bytes(token)
            if len(raw) > MAX_TOKEN_BYTES:
                raise TokenTooLargeError(len(raw), MAX_TOKEN_BYTES)
            try:
                token = raw.decode("ascii")
            except UnicodeDecodeError:
                raise TokenMalformedError("not ASCII") from None
        if not isinstance(token, str):
            raise TokenMalformedError(f"expected a string, got {type(token).__name__}")
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify(token)
            with self._verified_lock:
                if len(self._verified) >= _VERIFIED_CACHE:
                    self._verified.pop(next(iter(self._verified)))
                self._verified[token] = claims
        # Time and tenant are checked on every use, cached or not.
        if now > claims.expires + CLOCK_SKEW_S:
            raise TokenExpiredError(f"expired {human_age((now - claims.expires) * 1000)} ago")
        if claims.issued > now + CLOCK_SKEW_S:
            raise TokenNotYetValidError(
                f"issued {human_age((claims.issued - now) * 1000)} in the future")
        if tenant is not None and claims.tenant != tenant:
            raise TenantMismatchError(f"token tenant {claims.tenant!r} is not {tenant!r}")
        return claims

    def _verify(self, token: str) -> TokenClaims:
        """Signature and shape of a token (everything but time and tenant)."""
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenTooLargeError(len(token), MAX_TOKEN_BYTES)
        if not token.strip():
            raise TokenMalformedError("no token (the string given is empty)")
        body, sep, sig_text = token.partition(".")
        if not sep or "." in sig_text:
            raise TokenMalformedError("expected payload.signature")
        payload, sig = _unb64(body), _unb64(sig_text)
        if len(sig) != _SIG_BYTES:
            raise TokenMalformedError(f"signature is {len(sig)} bytes, not {_SIG_BYTES}")
        fields = _unpack(payload)
        version = fields[0]
        if type(version) is not int or version != VERSION:
            raise TokenVersionError(f"version {_short(version)} is not {VERSION}")
        if len(fields) != 8:
            raise TokenMalformedError(f"{len(fields)} fields, expected 8")
        _, kid, root, ctx, path, ten, issued, expires = fields
        if not isinstance(kid, str) or kid not in self._keys:
            raise UnknownKeyError(f"unknown key id {_short(kid)}: add the signer's "
                                  f"'kid:secret' pair to BUDGET_TOKEN_KEYS")
        want = hmac.digest(self._keys[kid], payload, "sha256")
        if not hmac.compare_digest(want, sig):
            raise TokenSignatureError("signature mismatch")
        ids = _check_claims(root, ctx, path, ten, issued, expires)
        return TokenClaims(root, ctx, ids, ten, issued, expires, kid)


def _unpack(payload: bytes) -> list[Any]:
    try:
        fields = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises many types on garbage  # noqa: BLE001
        raise TokenMalformedError("payload is not msgpack") from None
    if not isinstance(fields, list) or not fields:
        raise TokenMalformedError("payload is not a token")
    return fields


def _check_claims(root: Any, ctx: Any, path: Any, tenant: Any, issued: Any,
                  expires: Any) -> tuple[str, ...]:
    """The path of well-typed claims (signed claims are still checked: a key may be
    shared with an older or buggy issuer)."""
    if not (
        isinstance(root, str) and isinstance(ctx, str) and isinstance(tenant, str)
        and isinstance(path, list) and len(path) > 0
        and all(isinstance(p, str) and p for p in path) and len(set(path)) == len(path)
        and path[0] == root and path[-1] == ctx
        and type(issued) is int and type(expires) is int and issued <= expires
    ):
        raise TokenMalformedError("claims of the wrong type or shape")
    return tuple(path)
