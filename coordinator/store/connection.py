"""The Redis connection: the client type the layers above hold, and how a URL becomes one."""

from __future__ import annotations

import secrets

import redis

Client = redis.Redis
"""A Redis client (redis-py), with ``decode_responses=True``."""


def connect(url: str) -> Client:
    """A client for ``url`` (``redis://``, ``rediss://`` for TLS, ``user:pass@`` for ACL
    users), with the coordinator's timeouts."""
    return redis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0,
        health_check_interval=30,
    )


def shared_dev_key(client: Client, name: str) -> bytes:
    """The development token key kept in Redis under ``name``, created at random by the
    first process that asks (SET NX, then GET: one round trip each)."""
    client.set(name, secrets.token_hex(32), nx=True)
    return str(client.get(name)).encode()
