"""Topologies a nemesis can hurt: every Redis node behind a proxy that can delay or cut its
connections, and announced at the proxy's address (so clients, sentinels and replicas all
go through it), as a Sentinel set or a Cluster with one replica per primary."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import redis

from coordinator.embedded import RedisServer, free_port
from tests.support.topologies import CLUSTER_SLOTS, SentinelProcess, _info, cluster_port, wait_for


class ChaosProxy:
    """A loopback TCP proxy in front of one Redis node. ``delay(s)`` holds every reply
    chunk ``s`` seconds; ``cut(s)`` closes every connection and refuses new ones for ``s``
    seconds (a partition, as the clients see it)."""

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._delay_s = 0.0
        self._cut_until = 0.0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def delay(self, seconds: float) -> None:
        self._delay_s = seconds

    def cut(self, seconds: float) -> None:
        with self._lock:
            self._cut_until = time.monotonic() + seconds
            conns, self._conns = self._conns, []
        for sock in conns:
            _close(sock)

    def heal(self) -> None:
        self._delay_s, self._cut_until = 0.0, 0.0

    def close(self) -> None:
        self._closed = True
        self.cut(0)
        _close(self._server)

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            if time.monotonic() < self._cut_until:
                _close(down)
                continue
            try:
                up = socket.create_connection(("127.0.0.1", self.target_port), timeout=1)
                up.settimeout(None)
            except OSError:
                _close(down)  # the node is down: the client sees a reset
                continue
            with self._lock:
                self._conns += [down, up]
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self._delay_s:
                    time.sleep(self._delay_s)
                dst.sendall(data)
        except OSError:
            pass
        _close(src)
        _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


class Node:
    """One redis-server behind its ChaosProxy, announcing the proxy's port."""

    def __init__(self, extra_args: tuple[str, ...], *, cluster: bool) -> None:
        port = cluster_port() if cluster else None
        self.proxy_port = free_port()
        announce = (("--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port",
                     str(self.proxy_port)) if cluster else
                    ("--replica-announce-ip", "127.0.0.1", "--replica-announce-port",
                     str(self.proxy_port)))
        self.server = RedisServer(port, extra_args=(*announce, *extra_args))
        if cluster:
            bus = str(self.server.port + 10000)
            self.server.extra_args += ("--cluster-announce-bus-port", bus)
        self.proxy = ChaosProxy(self.server.port, self.proxy_port)
        self.paused = False

    def client(self, **kw: Any) -> redis.Redis:
        """A client straight to the node (not through the proxy)."""
        return redis.Redis(port=self.server.port, socket_timeout=2, **kw)

    @property
    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server.start()

    def pause(self) -> None:
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.server.proc is not None:
            os.kill(self.server.proc.pid, signal.SIGCONT)
        self.paused = False

    def role(self) -> str:
        return str(self.client(decode_responses=True).info("replication")["role"])

    def stop(self) -> None:
        self.resume()
        self.proxy.close()
        self.server.__exit__()


class ChaosSentinel:
    """A primary, two replicas and three sentinels (quorum 2), every node behind a proxy."""

    service = "bc"

    def __init__(self) -> None:
        self.nodes = [Node(("--save", "", "--appendonly", "no"), cluster=False)
                      for _ in range(3)]
        self.sentinels: list[SentinelProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self) -> ChaosSentinel:
        primary, *replicas = self.nodes
        primary.server.start()
        for node in replicas:
            node.server.extra_args += ("--replicaof", "127.0.0.1", str(primary.proxy_port))
            node.server.start()
        wait_for(lambda: primary.client().info("replication")["connected_slaves"] == 2,
                 20, "the replicas to sync")
        self.sentinels = [SentinelProcess(primary.proxy_port, 2) for _ in range(3)]
        for s in self.sentinels:
            s.start()
        wait_for(lambda: all(
            int(redis.Redis(port=s.port).sentinel_master(self.service)["num-other-sentinels"])
            == 2 and int(redis.Redis(port=s.port).sentinel_master(self.service)["num-slaves"])
            == 2 for s in self.sentinels), 20, "the sentinels to find each other")
        wait_for(self.healthy, 30, "the replicas to finish their first sync")
        return self

    def primary(self) -> Node:
        """The node the sentinels name as primary now."""
        sentinel = redis.Redis(port=self.sentinels[0].port, decode_responses=True,
                               socket_timeout=2)
        _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return next(n for n in self.nodes if n.proxy_port == int(port))

    def primaries(self) -> list[Node]:
        return [self.primary()]

    def replicas_of(self, primary: Node) -> list[Node]:
        return [n for n in self.nodes if n is not primary]

    def promote(self, primary: Node) -> None:
        """A manual failover (SENTINEL FAILOVER): a replica becomes the primary."""
        redis.Redis(port=self.sentinels[0].port, socket_timeout=2).execute_command(
            "SENTINEL", "FAILOVER", self.service)

    def healthy(self) -> bool:
        """Every node up, one primary with two replicas in sync, the sentinels agreeing."""
        if not all(n.alive and not n.paused for n in self.nodes):
            return False
        primary = self.primary()
        info = primary.client(decode_responses=True).info("replication")
        return info["role"] == "master" and int(info["connected_slaves"]) == 2 and all(
            n.client(decode_responses=True).info("replication").get("master_link_status")
            == "up" for n in self.replicas_of(primary))

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for n in self.nodes:
            n.stop()


class ChaosCluster:
    """Three primaries sharing the slots, one replica each, every node behind a proxy
    (announced at the proxy's port), with ``cluster-require-full-coverage no``."""

    def __init__(self, primaries: int = 3) -> None:
        args = ("--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                "--cluster-require-full-coverage", "no",
                "--cluster-replica-validity-factor", "0")
        self.nodes = [Node(args, cluster=True) for _ in range(primaries * 2)]
        self.count = primaries

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.proxy_port}" for n in self.nodes)

    def start(self) -> ChaosCluster:
        for n in self.nodes:
            n.server.start()
        clients = [n.client() for n in self.nodes]
        per = CLUSTER_SLOTS // self.count
        for i, c in enumerate(clients[:self.count]):
            end = CLUSTER_SLOTS if i == self.count - 1 else (i + 1) * per
            c.execute_command("CLUSTER ADDSLOTS", *range(i * per, end))
        for c in clients[1:]:
            c.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].server.port,
                              self.nodes[0].server.port + 10000)
        wait_for(lambda: all(int(_info(c)["cluster_known_nodes"]) == len(clients)
                             for c in clients), 20, "the nodes to meet")
        for primary, replica in zip(clients[:self.count], clients[self.count:], strict=True):
            node_id = primary.execute_command("CLUSTER MYID")
            node_id = node_id.decode() if isinstance(node_id, bytes) else node_id
            wait_for(lambda r=replica, i=node_id: r.execute_command("CLUSTER REPLICATE", i)
                     in (True, b"OK", "OK"), 20, "a replica to attach")
        wait_for(self.healthy, 30, "the cluster to be healthy")
        for c in clients:
            c.close()
        return self

    def _view(self) -> list[dict[str, Any]]:
        """CLUSTER NODES as a live node sees it: id, port (the proxy's), flags, master,
        slots (redis-py parses the reply)."""
        for n in self.nodes:
            if n.alive and not n.paused:
                try:
                    raw = n.client(decode_responses=True).execute_command("CLUSTER NODES")
                except redis.RedisError:
                    continue
                return [{"id": v["node_id"], "port": int(addr.split(":")[1].split("@")[0]),
                         "flags": v["flags"], "master": v["master_id"], "slots": v["slots"]}
                        for addr, v in raw.items()]
        return []

    def primaries(self) -> list[Node]:
        ports = {r["port"] for r in self._view()
                 if "master" in r["flags"] and "fail" not in r["flags"] and r["slots"]}
        return [n for n in self.nodes if n.proxy_port in ports]

    def replicas_of(self, primary: Node) -> list[Node]:
        view = self._view()
        ids = {r["id"] for r in view if r["port"] == primary.proxy_port}
        ports = {r["port"] for r in view if r["master"] in ids}
        return [n for n in self.nodes if n.proxy_port in ports]

    def promote(self, primary: Node) -> None:
        """A manual failover: CLUSTER FAILOVER on one of ``primary``'s replicas."""
        for replica in self.replicas_of(primary):
            if replica.alive and not replica.paused:
                replica.client().execute_command("CLUSTER FAILOVER")
                return

    def healthy(self) -> bool:
        """Every node up and the cluster ok, each primary with a replica linked."""
        if not all(n.alive and not n.paused for n in self.nodes):
            return False
        try:
            if any(_info(n.client())["cluster_state"] != "ok" for n in self.nodes):
                return False
        except redis.RedisError:
            return False
        view = self._view()
        primaries = [r for r in view if "master" in r["flags"] and r["slots"]]
        linked = [r for r in view if "slave" in r["flags"] and "fail" not in r["flags"]]
        return (len(primaries) == self.count and len(linked) == self.count
                and all(n.role() == "master" or n.client(decode_responses=True).info(
                    "replication").get("master_link_status") == "up" for n in self.nodes))

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
