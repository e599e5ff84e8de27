"""Configuration errors told apart from stalls: a Redis that answers with a wrong
password, a database out of range, an unknown Sentinel service, a server that is not
Redis, or TLS on one side only, raises ``BackendConfigError`` at once (retrying cannot
help); a Redis that does not answer stays a stall (calls fail closed, the breaker
probes)."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import redis

from ..core.redaction import redact_url
from ..errors import BackendConfigError

_PROBE_TIMEOUT_S = 1.0


def config_problem(exc: BaseException) -> str | None:
    """What is misconfigured, when ``exc`` is Redis answering that it is (else None)."""
    text = str(exc)
    if isinstance(exc, redis.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return f"authentication failed (wrong user or password): {text}"
    if isinstance(exc, redis.ResponseError) and "DB index is out of range" in text:
        return f"the database index is out of range for this server: {text}"
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return f"the server does not speak the Redis protocol: {text}"
    if isinstance(exc, ssl.SSLError) or isinstance(exc.__cause__, ssl.SSLError):
        return f"TLS failed: {text}"
    return None


def check_server(client: redis.Redis, url: str, exc: BaseException) -> None:
    """Raise ``BackendConfigError`` when ``exc`` (the first command's error on
    ``client``, a one-server client of ``url``) is a configuration error: one named by
    the reply, or TLS spoken to a plain server (or plain to a TLS-only one), found by
    one short connection the other way."""
    problem = config_problem(exc)
    if problem is None and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        kw = client.connection_pool.connection_kwargs
        host, port = kw.get("host"), kw.get("port")
        tls = client.connection_pool.connection_class is redis.SSLConnection
        if host is not None and port is not None:
            problem = _tls_mismatch(str(host), int(port), tls)
    if problem is not None:
        raise BackendConfigError(redact_url(url), problem) from None


def _tls_mismatch(host: str, port: int, tls: bool) -> str | None:
    """Why the server refuses our transport, when the other one works (else None)."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as sock:
            if tls:  # we spoke TLS: does it answer plain RESP?
                sock.sendall(b"PING\r\n")
                if sock.recv(16)[:1] in (b"+", b"-"):
                    return "TLS refused: the server does not speak TLS (use redis://)"
                return None
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            with context.wrap_socket(sock, server_hostname=host):
                return "TLS required: the server speaks only TLS (use rediss://)"
    except (OSError, ssl.SSLError):
        return None


def check_sentinel_client(client: redis.Redis, url: str) -> None:
    """For a Sentinel-managed ``client`` of ``url``: raise ``BackendConfigError`` when the
    sentinels answer but none knows the service, or refuse our credentials, or when the
    primary they name refuses ours (sentinels or a primary that do not answer: a
    stall, left to the breaker)."""
    pool: Any = client.connection_pool
    sentinel, service = pool.sentinel_manager, pool.service_name
    answered = False
    for node in sentinel.sentinels:
        try:
            addr: Any = node.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)
        except (redis.ConnectionError, redis.TimeoutError, OSError, redis.ResponseError,
                redis.exceptions.InvalidResponse) as exc:
            problem = config_problem(exc)
            if problem is not None:
                raise BackendConfigError(redact_url(url), f"sentinel: {problem}") from None
            continue
        if addr:
            break
        answered = True
    else:
        if answered:
            raise BackendConfigError(redact_url(url), f"no Sentinel service named "
                                     f"{service!r} (the sentinels answer; none monitors it)")
        return
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError, redis.ResponseError,
            redis.exceptions.InvalidResponse) as exc:
        check_server(client, url, exc)
