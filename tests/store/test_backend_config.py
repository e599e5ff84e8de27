"""Configuration errors fail fast and typed: a wrong password, a database index out of
range, an unknown Sentinel service, a server that is not Redis, TLS required or refused
raise ``BackendConfigError`` from ``Coordinator.from_url``, naming the problem, never
taken for a stall; a port where nothing listens stays a stall (calls fail closed)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator import Coordinator, Decision, ExecutionConfig, ExecutionContext, WrapOptions
from coordinator.embedded import RedisServer, find_redis_server, free_port
from coordinator.errors import BackendConfigError, BudgetCoordinatorError
from tests.support import procs
from tests.support.topologies import SentinelSet

PASSWORD = "s3cret-pw"
SMALL = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=10)


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A redis-server that requires a password."""
    with RedisServer() as server:
        redis.Redis(port=server.port).config_set("requirepass", PASSWORD)
        yield server


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    """A port where an HTTP server answers (not Redis)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(scope="module")
def tls_only_port() -> Iterator[int]:
    """A redis-server that speaks only TLS (a self-signed certificate)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    work = Path(tempfile.mkdtemp(prefix="bc-tls-"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(work / "key.pem"), "-out", str(work / "cert.pem"), "-days", "1",
                    "-subj", "/CN=localhost"], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([find_redis_server(), "--port", "0", "--tls-port", str(port),
                             "--tls-cert-file", str(work / "cert.pem"), "--tls-key-file",
                             str(work / "key.pem"), "--tls-auth-clients", "no", "--save", "",
                             "--dir", str(work)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s, \
                    context.wrap_socket(s) as tls:
                tls.sendall(b"PING\r\n")
                if tls.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip("this redis-server has no TLS")
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(work, ignore_errors=True)


def _refused(url: str) -> BackendConfigError:
    with pytest.raises(BackendConfigError) as err:
        Coordinator.from_url(url, token_keys=procs.TEST_KEYS)
    assert isinstance(err.value, BudgetCoordinatorError)
    return err.value


def test_a_wrong_password_is_a_configuration_error(locked_redis: RedisServer) -> None:
    err = _refused(f"redis://:wrong-{PASSWORD}@127.0.0.1:{locked_redis.port}/0")
    assert "authentication failed" in str(err)
    assert PASSWORD not in str(err) and ":**@" in str(err)


def test_no_password_where_one_is_required_is_a_configuration_error(
        locked_redis: RedisServer) -> None:
    assert "authentication failed" in str(_refused(locked_redis.url))


def test_the_right_password_connects(locked_redis: RedisServer) -> None:
    coord = Coordinator.from_url(f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0",
                                 token_keys=procs.TEST_KEYS)
    ctx = ExecutionContext(SMALL, coordinator=coord)
    assert ctx.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.01)) == \
        Decision.ALLOW
    ctx.close()
    coord.close()


def test_a_database_out_of_range_is_a_configuration_error(redis_url: str) -> None:
    err = _refused(redis_url.rsplit("/", 1)[0] + "/99")
    assert "database index is out of range" in str(err)


def test_a_server_that_is_not_redis_is_a_configuration_error(http_port: int) -> None:
    err = _refused(f"redis://127.0.0.1:{http_port}/0")
    assert "does not speak the Redis protocol" in str(err)


def test_tls_refused_by_a_plain_server_is_a_configuration_error(redis_url: str) -> None:
    err = _refused(redis_url.replace("redis://", "rediss://") + "?ssl_cert_reqs=none")
    assert "TLS refused" in str(err) and "use redis://" in str(err)


def test_tls_required_by_the_server_is_a_configuration_error(tls_only_port: int) -> None:
    err = _refused(f"redis://127.0.0.1:{tls_only_port}/0")
    assert "TLS required" in str(err) and "use rediss://" in str(err)
    coord = Coordinator.from_url(f"rediss://127.0.0.1:{tls_only_port}/0?ssl_cert_reqs=none",
                                 token_keys=procs.TEST_KEYS)  # and TLS connects
    assert coord.client.ping()
    coord.close()


@pytest.mark.slow
def test_an_unknown_sentinel_service_is_a_configuration_error() -> None:
    with SentinelSet(replicas=0) as ss:
        err = _refused(ss.url.replace("/bc", "/no-such-service"))
        assert "no Sentinel service named 'no-such-service'" in str(err)
        coord = Coordinator.from_url(ss.url, token_keys=procs.TEST_KEYS)  # the right one
        assert coord.client.ping()
        coord.close()


def test_a_port_where_nothing_listens_stays_a_stall() -> None:
    """Not a configuration error: from_url succeeds, calls fail closed, the breaker
    probes (and the calls flow once a Redis listens there)."""
    port = free_port()
    coord = Coordinator.from_url(f"redis://127.0.0.1:{port}/0", token_keys=procs.TEST_KEYS,
                                 probe_interval_ms=100)
    ctx = ExecutionContext(SMALL, coordinator=coord)
    opts = WrapOptions(cost_estimate_hint=0.01)
    assert ctx.wrap_llm_call(lambda: None, opts) == Decision.HALT
    assert coord.backend.down
    with RedisServer(port):
        deadline = time.monotonic() + 10
        while ctx.wrap_llm_call(lambda: None, opts) != Decision.ALLOW:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    coord.close()
