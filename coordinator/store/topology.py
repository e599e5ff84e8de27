"""Redis topologies: parse a URL into the right client (one server, Sentinel, Cluster) and
hand the write-behind wire, the stop listener and the flusher connections that follow it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from ..core.redaction import redact_url
from ..errors import TopologySettingError, TopologyURLError
from .backend_check import check_server

Client = redis.Redis | RedisCluster
"""A client the Coordinator accepts: ``Redis`` (also ``Sentinel.master_for(...)``) or
``RedisCluster``."""

CLIENT_OPTIONS: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": 2.0,
                                  "socket_timeout": 5.0}
_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster",
            "rediss+cluster")


class _BadPart(ValueError):
    """A part of a URL that cannot work (turned into TopologyURLError with the URL)."""

    def __init__(self, part: str, why: str) -> None:
        super().__init__(why)
        self.part, self.why = part, why


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


def _endpoints(netloc: str, default_port: int) -> tuple[list[Endpoint], str | None, str | None]:
    """``user:pass@h1:p1,h2:p2`` -> endpoints, user, password."""
    user = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, password = auth.partition(":") if ":" in auth else ("", "", auth)
        user, password = unquote(user) or None, unquote(password) or None
    out = []
    for part in netloc.split(","):
        if not part:
            continue
        if part.startswith("["):  # [ipv6]:port
            host, _, rest = part[1:].partition("]")
            port = rest.lstrip(":")
        else:
            host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
        try:
            out.append(Endpoint(host or "localhost", int(port) if port else default_port))
        except ValueError:
            raise _BadPart(part, "the port is not a number") from None
    if not out:
        raise _BadPart(netloc, "the URL names no host")
    return out, user, password


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() in ("1", "true", "yes", "on")


def client_from_url(url: str, **options: Any) -> Client:
    """The client for ``url`` (a URL that cannot work raises TopologyURLError naming it,
    its passwords shown as ``**``):

    - ``redis://[user:pass@]host:port/db``, ``rediss://`` (TLS), ``unix://``: one server;
      a cluster node (``cluster_enabled:1``) gets a ``RedisCluster`` seeded with it, and
      ``?cluster=true`` asks for one outright;
    - ``redis+sentinel://[user:pass@]s1:26379,s2:26379/<service>[/db]`` (``rediss+sentinel``
      or ``?ssl=true`` for TLS to the primary; ``?sentinel_password=`` and
      ``?sentinel_username=`` when the sentinels have their own): the primary the
      sentinels name, re-resolved after a failover;
    - ``redis+cluster://[user:pass@]h1:p1,h2:p2`` (``rediss+cluster`` for TLS): a cluster
      seeded with those nodes.
    """
    try:
        return _client(url, {**CLIENT_OPTIONS, **options})
    except _BadPart as exc:
        raise TopologyURLError(redact_url(url), exc.why, exc.part) from None


def _client(url: str, opts: dict[str, Any]) -> Client:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not url.strip():
        raise _BadPart("", "no Redis URL given (BUDGET_REDIS_URL, REDIS_URL, or a URL)")
    if scheme not in _SCHEMES:
        raise _BadPart(parts.scheme, "unsupported Redis URL scheme (one of "
                               f"{', '.join(s + '://' for s in _SCHEMES)})")
    query = parse_qs(parts.query)
    if scheme.endswith("+sentinel"):
        return _sentinel_client(parts.netloc, parts.path, query,
                                tls=scheme.startswith("rediss") or _flag(query, "ssl"), **opts)
    if scheme.endswith("+cluster") or _flag(query, "cluster"):
        nodes, user, password = _endpoints(parts.netloc, 6379)
        if parts.path.strip("/") not in ("", "0"):
            raise _BadPart(parts.path, "Redis Cluster has only database 0")
        return RedisCluster(
            startup_nodes=[ClusterNode(e.host, e.port)  # type: ignore[no-untyped-call]
                           for e in nodes], username=user,
            password=password, ssl=scheme.startswith("rediss") or _flag(query, "ssl"),
            **opts)
    try:
        plain = redis.Redis.from_url(url, health_check_interval=30, **opts)
    except ValueError as exc:  # redis-py's own refusals (a port out of range, ...)
        raise _BadPart("", str(exc)) from None
    return _cluster_if_node(plain, opts, url)


def _cluster_if_node(client: redis.Redis, opts: dict[str, Any], url: str) -> Client:
    """``client`` itself, or a ``RedisCluster`` seeded with it when its server is a
    cluster node (one INFO; an unreachable server is taken as a single one: calls fail
    closed until it answers). A configuration error raises ``BackendConfigError``."""
    try:
        info = client.info("cluster")
    except (redis.ConnectionError, redis.TimeoutError, OSError, redis.ResponseError,
            redis.exceptions.InvalidResponse) as exc:
        check_server(client, url, exc)
        return client
    if not info.get("cluster_enabled"):
        return client
    kw = client.connection_pool.connection_kwargs
    client.close()
    return RedisCluster(host=kw.get("host", "localhost"), port=int(kw.get("port", 6379)),
                        username=kw.get("username"), password=kw.get("password"),
                        ssl=client.connection_pool.connection_class is redis.SSLConnection,
                        **opts)


def _sentinel_client(netloc: str, path: str, query: dict[str, list[str]], *,
                     tls: bool, **opts: Any) -> redis.Redis:
    sentinels, user, password = _endpoints(netloc, 26379)
    segments = [s for s in path.split("/") if s]
    if not segments:
        raise _BadPart(path, "redis+sentinel:// needs the service name: "
                               "redis+sentinel://host:26379,host:26379/<service>[/db]")
    service = unquote(segments[0])
    try:
        db = int(segments[1]) if len(segments) > 1 else int(query.get("db", ["0"])[-1])
    except ValueError:
        raise _BadPart(path, "the database is not a number") from None
    sentinel_kwargs = {k: v for k, v in (
        ("password", query.get("sentinel_password", [None])[-1]),
        ("username", query.get("sentinel_username", [None])[-1]),
        ("socket_connect_timeout", opts["socket_connect_timeout"]),
        ("socket_timeout", opts["socket_timeout"])) if v is not None}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        [(e.host, e.port) for e in sentinels], sentinel_kwargs=sentinel_kwargs, **opts)
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        service, username=user, password=password, db=db, ssl=tls,
        health_check_interval=30, **opts)
    return client


class Wires:
    """Where the raw connections of the write-behind wire come from, and how they
    connect. One server and Sentinel: connections of the client's pool (Sentinel's pool
    asks the sentinels for the primary at every connect, so a reconnect after a failover
    finds the new one). Cluster: a connection per node, chosen by the key's slot (the
    tree's hash tag ``{R}``), so the write-behind pipes per node."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.cluster = client if isinstance(client, RedisCluster) else None

    @property
    def is_cluster(self) -> bool:
        return self.cluster is not None

    def node_of(self, key: str | None) -> str:
        """The name of the node serving ``key`` ('' on one primary or without a key)."""
        if self.cluster is None or key is None:
            return ""
        return str(self.cluster.get_node_from_key(key).name)  # type: ignore[no-untyped-call]

    def connection(self, node: str) -> Any:
        """A new raw connection to ``node`` (a name from :meth:`node_of`)."""
        if self.cluster is None:
            assert isinstance(self.client, redis.Redis)
            return self.client.connection_pool.make_connection()
        cluster: Any = self.cluster  # redis-py's cluster API is untyped
        target = cluster.get_node(node_name=node) if node else cluster.get_default_node()
        if target is None or target.redis_connection is None:
            self.refresh()
            target = cluster.get_default_node()
        return target.redis_connection.connection_pool.make_connection()

    @staticmethod
    def ready(conn: Any) -> None:
        """Connect ``conn`` through its own ``connect()`` when it is not connected: a
        Sentinel-managed connection resolves the current primary there, which the
        implicit connect of ``send_packed_command`` would skip."""
        if getattr(conn, "_sock", None) is None:
            conn.connect()

    def refresh(self) -> None:
        """Re-learn the cluster's slots (after MOVED, ASK or a failover)."""
        if self.cluster is not None:
            self.cluster.nodes_manager.initialize()


class NotReplicatedError(redis.ConnectionError):
    """With ``durability="replicated"``: a write was not acknowledged by enough replicas
    within the timeout (it may be on the primary only). Calls fail closed on it, like on
    an unreachable Redis; queued settles are sent again (they are idempotent)."""


@dataclass(frozen=True)
class Durability:
    """When a reserve or settle counts as done. ``local``: the primary acknowledged it
    (a failover may lose what had not reached a replica yet). ``replicated``: ``WAIT``
    also saw ``replicas`` replicas acknowledge it within ``timeout_ms``, else the call
    fails closed (one more round trip to the replicas per write batch)."""

    mode: str = "local"
    replicas: int = 1
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.mode not in ("local", "replicated"):
            raise TopologySettingError("durability", self.mode, "'local' or 'replicated'")
        for name, value, top in (("replicas", self.replicas, 16),
                                 ("wait_timeout_ms", self.timeout_ms, 60_000)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise TopologySettingError(name, value, f"an integer from 1 to {top}")

    @property
    def waits(self) -> bool:
        return self.mode == "replicated"
