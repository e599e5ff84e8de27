"""The Redis connection: the client type the layers above hold, and how a URL becomes one."""

from __future__ import annotations

import secrets

import redis
from redis.cluster import RedisCluster

from .backend_check import check_sentinel_client
from .topology import Client, client_from_url

__all__ = ["Client", "connect", "describe_client", "shared_dev_key"]


def connect(url: str, *, socket_timeout: float = 5.0, connect_timeout: float = 2.0
            ) -> Client:
    """A client for ``url`` with the timeouts of long operations (the hot path's are set
    on the wire's connections): one server (``redis://``, ``rediss://`` for TLS,
    ``user:pass@`` for ACL users), Sentinel (``redis+sentinel://``) or Redis Cluster
    (``redis+cluster://``, or a node's URL); see
    :func:`~coordinator.store.topology.client_from_url`. A configuration error (wrong
    password, database out of range, unknown Sentinel service, not Redis, TLS on one
    side only) raises ``BackendConfigError``; a Redis that does not answer is left to
    the backend breaker."""
    client = client_from_url(url, socket_timeout=socket_timeout,
                             socket_connect_timeout=connect_timeout)
    if isinstance(client, redis.Redis) and hasattr(client.connection_pool, "service_name"):
        check_sentinel_client(client, url)  # one server's were checked by its first INFO
    return client


DEV_KEY_NOTICE_S = 3600
"""How often the use of the development key is announced, per Redis (not per process)."""


def shared_dev_key(client: Client, name: str) -> tuple[bytes, bool]:
    """The development token key kept in Redis under ``name``, created at random by the
    first process that asks, and whether this process is the one to announce it: the
    first to ask in DEV_KEY_NOTICE_S (``<name>:notice``, SET NX EX), so a tree spread
    over many processes says it once. One round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.set(name, secrets.token_hex(32), nx=True)
    pipe.get(name)
    pipe.set(f"{name}:notice", "1", nx=True, ex=DEV_KEY_NOTICE_S)
    _, key, announce = pipe.execute()
    return str(key).encode(), bool(announce)


def describe_client(client: Client) -> str:
    """Where ``client`` connects, as a URL without its password (``redis://host:port/db``,
    ``redis+cluster://host:port``, or the Sentinel service)."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        return f"redis+cluster://{node.host}:{node.port}" if node else "redis+cluster://"
    kw = client.connection_pool.connection_kwargs
    service = getattr(client.connection_pool, "service_name", None)
    if service is not None:
        return f"redis+sentinel:///{service}/{kw.get('db', 0)}"
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
