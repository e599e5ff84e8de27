"""The Redis connection: the client type the layers above hold, and how a URL becomes one."""

from __future__ import annotations

import secrets

from .topology import Client, client_from_url

__all__ = ["Client", "connect", "shared_dev_key"]


def connect(url: str, *, socket_timeout: float = 5.0, connect_timeout: float = 2.0
            ) -> Client:
    """A client for ``url`` with the timeouts of long operations (the hot path's are set
    on the wire's connections): one server (``redis://``, ``rediss://`` for TLS,
    ``user:pass@`` for ACL users), Sentinel (``redis+sentinel://``) or Redis Cluster
    (``redis+cluster://``, or a node's URL); see
    :func:`~coordinator.store.topology.client_from_url`."""
    return client_from_url(url, socket_timeout=socket_timeout,
                           socket_connect_timeout=connect_timeout)


def shared_dev_key(client: Client, name: str) -> bytes:
    """The development token key kept in Redis under ``name``, created at random by the
    first process that asks (SET NX, then GET: one round trip each)."""
    client.set(name, secrets.token_hex(32), nx=True)
    return str(client.get(name)).encode()
