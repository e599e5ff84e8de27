"""Error texts a new user reads (issue 23, item 15; issue 29, item 22): no pydantic prefix,
the field named once, the limit stated, the URL named with its password hidden, "no token"
for an empty token, a long value cut, a typed answer for an abort reason of the wrong type,
Redis away said once, and the fix named for a token signed with a key not configured."""

from __future__ import annotations

import json

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.redaction import redact_url
from coordinator.core.token_codec import TokenCodec
from coordinator.embedded import RedisServer
from coordinator.errors import (
    BackendUnavailableError,
    InvalidConfigError,
    InvalidCostError,
    TokenExpiredError,
    TokenMalformedError,
    TopologyURLError,
    UnknownKeyError,
)
from coordinator.store.health import BackendDown


def test_invalid_config_says_what_is_wrong_without_pydantics_prefix() -> None:
    with pytest.raises(InvalidConfigError) as err:
        ExecutionConfig(max_cost_usd=1e12, max_steps=1, max_retries_total=1)
    assert str(err.value) == ("invalid ExecutionConfig: max_cost_usd must be a number "
                              "from one micro-dollar (1e-6) to 1e+09 (got 1000000000000.0)")
    with pytest.raises(InvalidConfigError) as err:
        ExecutionConfig(max_cost_usd=1, max_steps=1, max_retries_total=1,
                        deadline="x")  # type: ignore[arg-type]
    assert "Value error" not in str(err.value)
    assert str(err.value).count("'x'") == 1  # the value is said once
    assert str(err.value).count("deadline") == 1  # and the field


def test_redis_away_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    assert str(BackendUnavailableError("reserve", BackendDown())) == (
        "Redis unavailable during reserve: failing fast until Redis answers a probe")
    server = RedisServer()
    server.start()
    coord = Coordinator.from_url(server.url, probe_interval_ms=3_600_000)
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5, max_retries_total=2),
                           coordinator=coord)
    server.stop()
    for _ in range(2):  # the second finds the backend known down
        assert run.wrap_llm_call(lambda: None) == Decision.HALT
    run.close()
    coord.close()
    [closing] = [r.getMessage() for r in caplog.records if "closing" in r.getMessage()]
    assert closing.count("unavailable") == 1 and "probe" in closing, closing


def test_a_token_signed_with_a_key_not_configured_names_the_fix() -> None:
    token = TokenCodec({"new": b"n" * 32}).encode(root="r", path=("r",), tenant="",
                                                   ttl_s=60, now=1000.0)
    with pytest.raises(UnknownKeyError) as err:
        TokenCodec({"old": b"o" * 32}).decode(token, now=1000.0)
    assert str(err.value) == ("context token rejected: unknown key id 'new': add the "
                              "signer's 'kid:secret' pair to BUDGET_TOKEN_KEYS")


def test_an_expiry_long_past_reads_as_a_duration() -> None:
    codec = TokenCodec({"k": b"k" * 32})
    token = codec.encode(root="r", path=("r",), tenant="", ttl_s=60, now=1000.0)
    with pytest.raises(TokenExpiredError, match=r"expired 19h05m ago$"):
        codec.decode(token, now=1060.0 + 68_700)


def test_a_cost_beyond_any_real_call_states_the_limit(coord: Coordinator) -> None:
    # each invalid report counts its run's retry (docs/tokens.md): room for both
    run = ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=5, max_retries_total=2))
    with pytest.raises(InvalidCostError, match=r"^cost_usd must be a USD amount from 0 to "
                                               r"1e\+09; got 1000000000000\.0$"):
        run.wrap_llm_call(lambda: report_usage(cost_usd=1e12), WrapOptions(cost_estimate_hint=0.01))
    with pytest.raises(InvalidCostError, match=r"input_tokens must be a whole number of "
                                               r"tokens from 0 to 1e\+15; got 1\.5"):
        run.wrap_llm_call(lambda: report_usage(input_tokens=1.5))  # type: ignore[arg-type]
    run.close()


@pytest.mark.parametrize(("url", "shown", "part"), [
    ("http://alice:s3cret@x:1/0", "http://alice:**@x:1/0", "http"),
    ("redis+sentinel://u:s3cret@h:notaport/svc", "redis+sentinel://u:**@h:notaport/svc",
     "h:notaport"),
    ("redis+cluster://:s3cret@127.0.0.1:7000/2", "redis+cluster://:**@127.0.0.1:7000/2",
     "/2"),
    ("redis://:s3cret@h:99999999/0", "redis://:**@h:99999999/0", None),
    ("redis+sentinel://h:1/svc/x?sentinel_password=s3cret",
     "redis+sentinel://h:1/svc/x?sentinel_password=**", "/svc/x"),
])
def test_a_bad_url_is_named_with_its_password_hidden(url: str, shown: str,
                                                     part: str | None) -> None:
    with pytest.raises(TopologyURLError) as err:
        Coordinator.from_url(url)
    assert err.value.value == shown
    assert str(err.value).startswith(f"url={shown!r}: ")
    assert "s3cret" not in str(err.value)
    if part:
        assert str(err.value).endswith(f" ({part!r})")
    assert redact_url("redis://bob:pw@h:1/0?password=pw2") == "redis://bob:**@h:1/0?password=**"


def test_an_empty_url_says_none_was_given() -> None:
    with pytest.raises(TopologyURLError, match="no Redis URL given"):
        Coordinator.from_url("")


def test_attach_of_an_empty_token_says_no_token(coord: Coordinator) -> None:
    with pytest.raises(TokenMalformedError, match="no token"):
        ExecutionContext.attach("")


def test_a_long_label_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidConfigError) as err:
        ChainMetadata(service="x" * 2000)
    text = str(err.value)
    assert len(text) < 200 and "(2000 characters)" in text, text


def test_the_abort_api_answers_a_reason_of_the_wrong_type(redis_url: str) -> None:
    pytest.importorskip("starlette")
    from tests.support.dashboard_server import OPERATOR_TOKEN, coordinator, dashboard, open_tree

    coord = coordinator(redis_url)
    root = open_tree(coord, "typed-reason")
    coord.store.flush()
    with dashboard(redis_url) as http:
        path = f"/api/trees/{root.chain_id}/abort"
        status, _, body = http.request("POST", path, token=OPERATOR_TOKEN, body={"reason": 5})
        assert status == 400
        assert json.loads(body)["error"] == "the reason must be a string, got int"
        status, _, body = http.request("POST", path, token=OPERATOR_TOKEN, body={})
        assert status == 400 and json.loads(body)["error"] == "a reason is required"
    assert ExecutionContext.load_snapshot(root.chain_id, coord).status == "running"
    root.close()
    coord.close()
