"""Real local topologies for the tests: a 3-primary Redis Cluster and a primary with
replicas watched by three sentinels, started as redis-server processes on free ports."""

from __future__ import annotations

import queue
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from coordinator.embedded import RedisServer, find_redis_server

CLUSTER_SLOTS = 16384


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 50000)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _info(client: redis.Redis) -> dict[str, str]:
    raw = client.execute_command("CLUSTER INFO")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


class Cluster:
    """Three primaries sharing the 16384 slots (created with CLUSTER ADDSLOTS and CLUSTER
    MEET from Python: no redis-cli needed, so Redis 6.2 runs it too). With ``replicas``,
    each primary gets that many replicas, and the nodes run with
    ``cluster-require-full-coverage no`` (the setting deploy/ recommends), so a dead
    primary stops only its own slots."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        coverage = ("--cluster-require-full-coverage", "no") if replicas else ()
        self.nodes = [RedisServer(cluster_port(), extra_args=(
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000", *coverage))
            for _ in range(primaries * (1 + replicas))]
        self.primaries = primaries

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node_url(self, i: int = 0) -> str:
        return self.nodes[i].url

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=n.port, decode_responses=True) for n in self.nodes]
        per = CLUSTER_SLOTS // self.primaries
        for i, c in enumerate(clients[: self.primaries]):
            end = CLUSTER_SLOTS if i == self.primaries - 1 else (i + 1) * per
            c.execute_command("CLUSTER ADDSLOTS", *range(i * per, end))
        for c in clients[1:]:
            c.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        wait_for(lambda: all(int(_info(c)["cluster_known_nodes"]) == len(clients)
                             for c in clients), 20, "the nodes to meet")
        for i, c in enumerate(clients[self.primaries:]):
            primary = clients[i % self.primaries]
            c.execute_command("CLUSTER REPLICATE", primary.execute_command("CLUSTER MYID"))
        wait_for(lambda: all(_info(c)["cluster_state"] == "ok" for c in clients)
                 and all(c.info("replication").get("master_link_status") == "up"
                         for c in clients[self.primaries:]), 30, "the cluster to form")
        for c in clients:
            c.close()
        return self

    def flush(self) -> None:
        for n in self.nodes[: self.primaries]:
            c = redis.Redis(port=n.port)
            c.flushall()
            c.script_flush()
            c.close()

    def primary_index(self, key: str) -> int:
        """Which of the first ``primaries`` nodes serves ``key`` (as the cluster began)."""
        from redis.crc import key_slot

        return min(key_slot(key.encode()) // (CLUSTER_SLOTS // self.primaries),
                   self.primaries - 1)

    def replica_of(self, i: int) -> RedisServer:
        """The (first) replica of primary ``i``."""
        return self.nodes[self.primaries + i]

    def stop(self) -> None:
        for node in self.nodes:
            node.__exit__()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LagProxy:
    """A TCP proxy that delays what the primary sends to a replica by ``lag_ms`` (the
    replication lag of a slow link). ``stop()`` drops what it still holds: with the
    primary SIGKILLed at the same moment, those writes never reach the replica."""

    def __init__(self, target_port: int, lag_ms: int) -> None:
        self.target_port, self.lag = target_port, lag_ms / 1000
        self.port = RedisServer().port
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._socks: list[socket.socket] = [self._server]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(down)
                if self._stopped.is_set():
                    down.close()
                    return
            try:
                up = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                continue  # the primary is gone; the replica will try again
            with self._lock:
                self._socks.append(up)
                if self._stopped.is_set():
                    up.close()
                    return
            delayed: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=self._pump, args=(down, up, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, delayed), daemon=True).start()
            threading.Thread(target=self._release, args=(delayed, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket,
              delayed: queue.Queue[tuple[float, bytes]] | None) -> None:
        try:
            while not self._stopped.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if delayed is None:
                    dst.sendall(data)
                else:
                    delayed.put((time.monotonic() + self.lag, data))
        except OSError:
            pass

    def _release(self, delayed: queue.Queue[tuple[float, bytes]], dst: socket.socket) -> None:
        try:
            while not self._stopped.is_set():
                try:
                    due, data = delayed.get(timeout=0.1)
                except queue.Empty:
                    continue
                time.sleep(max(0.0, due - time.monotonic()))
                if self._stopped.is_set():
                    return
                dst.sendall(data)
        except OSError:
            pass

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass


class SentinelProcess:
    """One ``redis-server --sentinel`` watching the service ``bc``."""

    def __init__(self, primary_port: int, quorum: int, failover_timeout_ms: int = 4000
                 ) -> None:
        self.port = RedisServer().port
        self.dir = tempfile.mkdtemp(prefix="bc-sentinel-")
        self.conf = Path(self.dir) / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor bc 127.0.0.1 {primary_port} {quorum}\n"
            "sentinel down-after-milliseconds bc 1000\n"
            f"sentinel failover-timeout bc {failover_timeout_ms}\n"
            "sentinel parallel-syncs bc 2\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([find_redis_server(), str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: redis.Redis(port=self.port, socket_timeout=0.5).ping(), 10,
                 "a sentinel to start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelSet:
    """A primary, ``replicas`` replicas and three sentinels (quorum 2) for service ``bc``.
    With ``lag_ms``, each replica replicates through a LagProxy (and the sentinels' fix
    of a replica's master address waits ``failover_timeout_ms``, so keep it long)."""

    service = "bc"

    def __init__(self, replicas: int = 1, *, lag_ms: int = 0,
                 failover_timeout_ms: int = 4000) -> None:
        self.primary = RedisServer()
        self.proxies = [LagProxy(self.primary.port, lag_ms) for _ in range(replicas)
                        ] if lag_ms else []
        ports = [p.port for p in self.proxies] or [self.primary.port] * replicas
        self.replicas = [RedisServer(extra_args=("--replicaof", "127.0.0.1", str(port)))
                         for port in ports]
        self.failover_timeout_ms = failover_timeout_ms
        self.sentinels: list[SentinelProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def start(self) -> SentinelSet:
        self.primary.start()
        for r in self.replicas:
            r.start()
        primary = redis.Redis(port=self.primary.port)
        wait_for(lambda: primary.info("replication")["connected_slaves"] == len(self.replicas)
                 and all(redis.Redis(port=r.port).info("replication")
                         .get("master_link_status") == "up" for r in self.replicas),
                 20, "the replicas to sync")
        self.sentinels = [SentinelProcess(self.primary.port, 2, self.failover_timeout_ms)
                          for _ in range(3)]
        for s in self.sentinels:
            s.start()
        wait_for(lambda: all(
            int(redis.Redis(port=s.port).sentinel_master(self.service)["num-other-sentinels"])
            == 2 for s in self.sentinels), 20, "the sentinels to find each other")
        return self

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now."""
        sentinel = redis.Redis(port=self.sentinels[0].port, decode_responses=True)
        _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def agreed_primary(self) -> int | None:
        """The primary's port when every sentinel names the same one, none flags it down
        or failing over, and it says it is a primary; else None (a failover under way,
        or a second one starting: with these short timeouts the sentinels sometimes run
        two in a row)."""
        ports = set()
        for s in self.sentinels:
            state = redis.Redis(port=s.port, decode_responses=True).sentinel_master(
                self.service)
            if state["flags"] != "master":
                return None
            ports.add(int(state["port"]))
        if len(ports) != 1:
            return None
        port = ports.pop()
        role = redis.Redis(port=port, socket_timeout=0.5).info("replication")["role"]
        return port if role == "master" else None

    def flush(self) -> None:
        c = redis.Redis(port=self.primary_port())
        c.flushall()
        c.script_flush()
        c.close()

    def kill_primary(self) -> None:
        """SIGKILL the primary; what the lag proxies still hold is lost with it."""
        self.primary.kill()
        for proxy in self.proxies:
            proxy.stop()

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for proxy in self.proxies:
            proxy.stop()
        for server in self.servers():
            server.__exit__()

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sentinel_missing() -> str | None:
    """Why Sentinel cannot run here (a redis-server without sentinel mode), or None."""
    try:
        out = subprocess.run([find_redis_server(), "--version"], capture_output=True,
                             timeout=10).stdout.decode()
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"no redis-server: {exc}"
    if "v=" not in out:
        return f"unrecognised redis-server: {out!r}"
    return None


def failover_agent(url: str, token: str, seed: int, seconds: float, durability: str,
                   ready: Any, out: Any, pause_s: float = 0.01) -> None:
    """Spend through an attached context for ``seconds``, riding out a failover: a call
    refused because Redis is away (or not replicated) is tried again after a pause.
    Reports the micro-USD its calls really spent (a body that ran), to compare with what
    Redis holds at the end, and how many calls it made and was refused."""
    from coordinator import Coordinator, Decision, ExecutionContext, WrapOptions, report_usage
    from tests.support.procs import TEST_KEYS

    rng = random.Random(seed)
    coord = Coordinator.from_url(url, token_keys=TEST_KEYS, lease_ms=5000,
                                 durability=durability, wait_timeout_ms=500)
    ctx = ExecutionContext.attach(token, coordinator=coord)
    ready.put(seed)
    spent = allowed = offline = 0
    allowed_at: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        estimate = rng.choice([2000, 5000, 10000])
        actual = int(estimate * rng.uniform(0.3, 1.0))
        ran = []

        def body() -> None:
            ran.append(True)
            report_usage(cost_usd=actual / 1_000_000)

        d = ctx.wrap_llm_call(body, WrapOptions(cost_estimate_hint=estimate / 1_000_000))
        spent += actual if ran else 0
        if d == Decision.ALLOW:
            allowed += 1
            allowed_at.append(time.time())
            time.sleep(pause_s)  # an agent thinks between calls (and node streams hold 10k)
        elif ctx.stop_reason is None:
            offline += 1  # Redis away or not replicated: fail closed, try again
            time.sleep(0.05)
        else:
            break
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # every queued settle must land before reporting
        try:
            coord.store.flush()
            if not coord.store.wire._pending:
                break
        except Exception:  # noqa: BLE001 - Redis may still be failing over
            time.sleep(0.1)
    coord.close()
    gaps = [b - a for a, b in zip(allowed_at, allowed_at[1:], strict=False)]
    out.put({"spent": spent, "allowed": allowed, "offline": offline,
             "last_allowed": max(allowed_at, default=0.0), "max_gap": max(gaps, default=0.0),
             "pending": len(coord.store.wire._pending)})
