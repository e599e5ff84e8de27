"""The context token: every kind of bad token gets its typed error, keys rotate, a token
can neither raise a limit nor reach another tree or tenant."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import pickle
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.token_codec import CLOCK_SKEW_S, MAX_TOKEN_BYTES, TokenCodec, parse_keys
from coordinator.embedded import RedisServer, free_port
from coordinator.errors import (
    TenantMismatchError,
    TokenError,
    TokenExpiredError,
    TokenMalformedError,
    TokenNotYetValidError,
    TokenSignatureError,
    TokenTooLargeError,
    TokenVersionError,
    UnknownKeyError,
)
from tests.support.procs import TEST_KEYS

NOW = 1_700_000_000.0
CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=10)
KEY = TEST_KEYS["test"]
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(fields: list[Any], key: bytes = KEY) -> str:
    """A token with arbitrary fields, signed with ``key`` (what an attacker without the
    key, or a buggy issuer with it, could produce)."""
    payload = msgpack.packb(fields)
    return f"{b64(payload)}.{b64(hmac.new(key, payload, hashlib.sha256).digest())}"


def good_fields(**over: Any) -> list[Any]:
    f = {"v": 1, "kid": "test", "root": "r", "ctx": "c", "path": ["r", "c"], "tenant": "",
         "issued": int(NOW), "expires": int(NOW) + 600}
    f.update(over)
    return list(f.values())


@pytest.fixture
def codec() -> TokenCodec:
    return TokenCodec(TEST_KEYS)


def test_a_token_round_trips_and_carries_names_not_limits(codec: TokenCodec) -> None:
    token = codec.encode(root="r", path=("r", "a", "c"), tenant="t1", ttl_s=600, now=NOW)
    claims = codec.decode(token, now=NOW, tenant="t1")
    assert (claims.root, claims.context, claims.path, claims.tenant, claims.kid) == (
        "r", "c", ("r", "a", "c"), "t1", "test")
    assert claims.expires - claims.issued == 600
    body = token.split(".")[0]
    fields = msgpack.unpackb(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert fields == [1, "test", "r", "c", ["r", "a", "c"], "t1", int(NOW), int(NOW) + 600]
    assert set(token) <= set(ALPHABET) | {"."}  # header-safe as is


BAD_TOKENS: dict[str, tuple[Any, type[TokenError], int]] = {
    # name: (token or a function of a valid token, error, HTTP status)
    "tampered": (lambda t: forge(good_fields(ctx="other", path=["r", "other"]), b"x" * 32)
                 .split(".")[0] + "." + t.split(".")[1], TokenSignatureError, 401),
    "truncated": (lambda t: t[:-5], TokenMalformedError, 400),
    "truncated payload": (lambda t: t[:20], TokenMalformedError, 400),
    "expired": (forge(good_fields(issued=int(NOW) - 7200, expires=int(NOW) - 3600)),
                TokenExpiredError, 401),
    "not yet valid": (forge(good_fields(issued=int(NOW) + 3600, expires=int(NOW) + 7200)),
                      TokenNotYetValidError, 401),
    "oversized": (lambda t: t + "A" * MAX_TOKEN_BYTES, TokenTooLargeError, 400),
    "unknown key": (forge(good_fields(kid="old"), b"k" * 32), UnknownKeyError, 401),
    "wrong version": (forge(good_fields(v=2)), TokenVersionError, 400),
    "bool version": (forge(good_fields(v=True)), TokenVersionError, 400),
    "re-signed with a wrong key": (forge(good_fields(), b"not-the-secret-but-long"),
                                   TokenSignatureError, 401),
    "another tenant": (forge(good_fields(tenant="B")), TenantMismatchError, 403),
    "path not from root": (forge(good_fields(path=["x", "c"])), TokenMalformedError, 400),
    "expiry before issue": (forge(good_fields(expires=int(NOW) - 1)), TokenMalformedError,
                            400),
    "non-canonical base64": (lambda t: t[:-1] + ALPHABET[ALPHABET.index(t[-1]) ^ 1],
                             TokenMalformedError, 400),
    "non-ASCII bytes": ("é.é".encode("latin-1"), TokenMalformedError, 400),
    "not a string": (12345, TokenMalformedError, 400),
    "empty": ("", TokenMalformedError, 400),
}


@pytest.mark.parametrize("name", BAD_TOKENS)
def test_each_kind_of_bad_token_gets_its_typed_error(codec: TokenCodec, name: str) -> None:
    make, error, status = BAD_TOKENS[name]
    valid = codec.encode(root="r", path=("r", "c"), tenant="", ttl_s=600, now=NOW)
    token = make(valid) if callable(make) else make
    with pytest.raises(error) as info:
        codec.decode(token, now=NOW, tenant="")
    assert info.value.status_code == status
    assert "context token rejected" in str(info.value)


def test_every_single_character_change_is_rejected(codec: TokenCodec) -> None:
    """Canonical base64url: no token has a second spelling that verifies."""
    token = codec.encode(root="r", path=("r", "c"), tenant="", ttl_s=600, now=NOW)
    accepted = []
    for i, old in enumerate(token):
        for new in ALPHABET + ".":
            if new == old:
                continue
            mutated = token[:i] + new + token[i + 1:]
            try:
                codec.decode(mutated, now=NOW)
            except TokenError:
                continue
            accepted.append(mutated)
    assert accepted == []


def test_keys_rotate_without_downtime() -> None:
    old = TokenCodec({"k1": b"first-secret-0123456789"})
    before = old.encode(root="r", path=("r",), tenant="", ttl_s=600, now=NOW)
    # Step 1: every service learns the new key, still signing with the old one...
    both_old_first = TokenCodec(parse_keys("k1:first-secret-0123456789,k2:second-secret-0123456"))
    # ...step 2: the new key signs; tokens issued before verify everywhere.
    rotated = TokenCodec(parse_keys("k2:second-secret-0123456,k1:first-secret-0123456789"))
    after = rotated.encode(root="r", path=("r",), tenant="", ttl_s=600, now=NOW)
    assert both_old_first.decode(after, now=NOW).kid == "k2"
    assert rotated.decode(before, now=NOW).kid == "k1"
    assert rotated.signing_kid == "k2"
    # Step 3: the old key is retired; its tokens stop working.
    retired = TokenCodec(parse_keys("k2:second-secret-0123456"))
    assert retired.decode(after, now=NOW).kid == "k2"
    with pytest.raises(UnknownKeyError):
        retired.decode(before, now=NOW)


@pytest.mark.parametrize("spec", ["", " , ", "nocolon", ":secret-0123456789ab",
                                  "k:short", "k:secret-0123456789ab,k:secret-0123456789cd"])
def test_bad_key_configuration_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_keys(spec)


def test_a_codec_refuses_short_secrets() -> None:
    with pytest.raises(ValueError):
        TokenCodec({"k": b"short"})


def test_the_issuer_refuses_a_token_no_receiver_would_accept(codec: TokenCodec) -> None:
    deep = tuple(f"{i:032x}" for i in range(200))
    with pytest.raises(TokenTooLargeError):
        codec.encode(root=deep[0], path=deep, tenant="", ttl_s=60, now=NOW)
    with pytest.raises(ValueError):
        codec.encode(root="r", path=("x", "c"), tenant="", ttl_s=60, now=NOW)


# -- against Redis -----------------------------------------------------------------------

def redis_state(client: redis.Redis) -> dict[str, Any]:
    """Every key and its value, to prove that nothing changed."""
    state: dict[str, Any] = {}
    for key in client.scan_iter("*"):
        kind = client.type(key)
        if kind == "hash":
            state[key] = client.hgetall(key)
        elif kind == "set":
            state[key] = sorted(client.smembers(key))
        elif kind == "zset":
            state[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            state[key] = client.xrange(key)
        elif kind == "list":
            state[key] = client.lrange(key, 0, -1)
        else:
            state[key] = client.get(key)
    return state


def spend(ctx: ExecutionContext, usd: float) -> Decision:
    def call() -> None:
        report_usage(cost_usd=usd)

    return ctx.wrap_llm_call(call, WrapOptions(cost_estimate_hint=usd))


@pytest.fixture
def other(redis_url: str) -> Iterator[Coordinator]:
    """A second coordinator on the same Redis and keys: another service."""
    c = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    yield c
    c.close()
    c.client.close()


def test_a_token_never_raises_a_limit(coord: Coordinator, other: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        assert spend(root, 0.70) == Decision.ALLOW
        joined = ExecutionContext.attach(root.token, other)
        child = joined.spawn_child(max_cost_usd=100.0, max_steps=10_000)
        assert child.config.max_cost_usd == pytest.approx(0.30)
        assert spend(child, 0.50) == Decision.HALT  # it would pass 100, not the root's 1
        assert spend(joined, 0.50) == Decision.HALT
        assert spend(child, 0.30) == Decision.ALLOW
        child.close()
        joined.close()
        snap = root.get_snapshot()
        assert snap.cost_usd_accumulated == pytest.approx(1.0)
        assert snap.max_cost_usd == pytest.approx(1.0)


def test_a_forged_token_is_refused_and_changes_nothing(coord: Coordinator) -> None:
    with ExecutionContext(CONFIG, coordinator=coord) as root:
        spend(root, 0.1)
        coord.store.flush()
        before = redis_state(coord.client)
        forger = Coordinator(coord.client, token_keys={"test": b"a-guessed-secret-0123456789"})
        for token in (forger.token_codec().encode(root=root.root_id, path=root.path, tenant="",
                                          ttl_s=600, now=time.time()),
                      root.token[:-3], root.token + "x" * MAX_TOKEN_BYTES):
            with pytest.raises(TokenError):
                ExecutionContext.attach(token, coord)
        assert redis_state(coord.client) == before


def test_a_token_reaches_only_its_own_tree(coord: Coordinator, other: Coordinator) -> None:
    tree_x = ExecutionContext(CONFIG, coordinator=coord)
    tree_y = ExecutionContext(CONFIG, coordinator=coord)
    # Point a token of X at Y's root: without the key the signature cannot follow.
    fields = good_fields(root=tree_y.root_id, ctx=tree_y.chain_id, path=[tree_y.root_id],
                         issued=int(time.time()), expires=int(time.time()) + 600)
    with pytest.raises(TokenSignatureError):
        ExecutionContext.attach(forge(fields, b"x" * 32)[:-43] + tree_x.token[-43:], other)
    joined = ExecutionContext.attach(tree_x.token, other)
    assert joined.root_id == tree_x.root_id
    assert spend(joined, 0.25) == Decision.ALLOW
    joined.close()
    assert tree_x.get_snapshot().cost_usd_accumulated == pytest.approx(0.25)
    assert tree_y.get_snapshot().cost_usd_accumulated == 0.0
    tree_x.close()
    tree_y.close()


def test_tenants_refuse_each_others_tokens_and_never_share_keys(redis_url: str) -> None:
    coords = {t: Coordinator.from_url(redis_url, tenant=t, token_keys=TEST_KEYS)
              for t in ("A", "B")}
    roots = {}
    for tenant, usd in (("A", 0.1), ("B", 0.4)):
        meta = ChainMetadata(request_id="req", chain_id="same-chain-id")
        roots[tenant] = ExecutionContext(CONFIG, metadata=meta,
                                         coordinator=coords[tenant])
        assert spend(roots[tenant], usd) == Decision.ALLOW
    assert roots["A"].get_snapshot().cost_usd_accumulated == pytest.approx(0.1)
    assert roots["B"].get_snapshot().cost_usd_accumulated == pytest.approx(0.4)
    keys = set(coords["A"].client.scan_iter("*"))
    a_keys = {k for k in keys if k.startswith("bc:t:A:")}
    b_keys = {k for k in keys if k.startswith("bc:t:B:")}
    assert a_keys and b_keys and a_keys | b_keys == keys
    with pytest.raises(TenantMismatchError) as info:
        ExecutionContext.attach(roots["B"].token, coords["A"])
    assert info.value.status_code == 403
    assert ExecutionContext.attach(roots["A"].token, coords["A"]).root_id == "same-chain-id"
    for tenant in ("A", "B"):
        roots[tenant].close()
        coords[tenant].close()
        coords[tenant].client.close()


def test_the_tenant_comes_from_budget_tenant(redis_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGET_TENANT", "acme")
    c = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    assert c.tenant == "acme" and c.keyspace.prefix == "bc:t:acme"
    c.client.close()


def test_without_keys_a_dev_key_kept_in_redis_is_used_and_announced(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("BUDGET_TOKEN_KEYS", raising=False)
    first, second = Coordinator.from_url(redis_url), Coordinator.from_url(redis_url)
    configured = Coordinator.from_url(redis_url, token_keys=TEST_KEYS)
    with caplog.at_level(logging.WARNING, logger="coordinator"):
        token = first.token_codec().encode(root="r", path=("r",), tenant="", ttl_s=60,
                                           now=time.time())
    assert "not for production" in caplog.text
    assert first.client.get("bc:token-dev-key") is not None
    assert second.token_codec().decode(token, now=time.time()).kid == "dev"
    with pytest.raises(UnknownKeyError):  # a configured service never accepts dev tokens
        configured.token_codec().decode(token, now=time.time())
    for c in (first, second, configured):
        c.client.close()


def test_an_acl_user_in_the_url_works(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser("budget-svc", enabled=True, passwords=["+svc-password-123"],
                      keys=["bc:*"], channels=["bc:*"], reset_channels=True,
                      commands=["+@all", "-@dangerous"])
    try:
        url = redis_url.replace("redis://", "redis://budget-svc:svc-password-123@")
        c = Coordinator.from_url(url, token_keys=TEST_KEYS)
        with ExecutionContext(CONFIG, coordinator=c) as ctx:
            assert spend(ctx, 0.2) == Decision.ALLOW
            assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.2)
        c.close()
        c.client.close()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url.replace("svc-password", "bad-password")).ping()
    finally:
        admin.acl_deluser("budget-svc")
        admin.close()


def test_rediss_tls_with_an_acl_user_works_through_the_url(tmp_path: Any) -> None:
    """``rediss://user:password@host:port/db?ssl_ca_certs=...``: TLS and an ACL user with
    nothing but the URL."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    tls_port = free_port()
    args = ("--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file",
            str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no")
    server = RedisServer(extra_args=args)
    try:
        server.start()
    except RuntimeError as exc:
        if "tls-port" in str(exc):
            pytest.skip("this redis-server was built without TLS")
        raise
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(  # the user docs/http.md gives
            "ACL", "SETUSER", "budget-svc", "on", ">svc-password-123", "resetchannels",
            "~bc:*", "&bc:*", "-@all", "+@read", "+@write", "+@scripting", "+@pubsub",
            "+time", "+ping", "-@dangerous")
        admin.close()
        url = (f"rediss://budget-svc:svc-password-123@127.0.0.1:{tls_port}/0"
               f"?ssl_ca_certs={cert}")
        c = Coordinator.from_url(url, token_keys=TEST_KEYS)
        with ExecutionContext(CONFIG, coordinator=c) as ctx:
            assert spend(ctx, 0.3) == Decision.ALLOW
            joined = ExecutionContext.attach(ctx.token, c)
            assert spend(joined, 0.2) == Decision.ALLOW
            joined.close()
            assert ctx.get_snapshot().cost_usd_accumulated == pytest.approx(0.5)
        c.close()
        c.client.close()
        with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as plain:
            plain.sendall(b"PING\r\n")  # plain text is refused on the TLS port
            try:
                answer = plain.recv(16)
            except ConnectionResetError:
                answer = b""
            assert not answer.startswith(b"+PONG")
    finally:
        server.stop()


def test_a_cached_token_is_still_checked_for_time_and_tenant() -> None:
    codec = TokenCodec({"k": b"0123456789abcdef-secret"})
    token = codec.encode(root="r", path=("r", "c"), tenant="a", ttl_s=60, now=1000.0)
    assert codec.decode(token, now=1001.0, tenant="a").context == "c"  # now cached
    with pytest.raises(TenantMismatchError):
        codec.decode(token, now=1001.0, tenant="b")
    with pytest.raises(TokenExpiredError):
        codec.decode(token, now=1000.0 + 60 + CLOCK_SKEW_S + 1, tenant="a")
    with pytest.raises(TokenNotYetValidError):
        codec.decode(token, now=1000.0 - CLOCK_SKEW_S - 1, tenant="a")


@pytest.mark.parametrize("error", [TokenSignatureError("signature mismatch"),
                                   TokenTooLargeError(5000, 4096)])
def test_a_token_error_rebuilt_from_its_args_says_its_prefix_once(error: TokenError) -> None:
    """Pickling, and Celery's result backends, rebuild an exception from its args."""
    for copy in (pickle.loads(pickle.dumps(error)), type(error)(*error.args)):
        assert str(copy) == str(error)
        assert str(copy).count("context token rejected") == 1
