"""Numbers in Redis are canonical or corrupt: every string Lua's ``tonumber`` reads as a
number but the project never writes (hex, exponents, spaces, signs, decimals, leading
zeros) stops its level with ``state_corrupt`` instead of lifting a ceiling, in
lua/lib/numbers.lua's ``stored_num`` and in its Python twin alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.core.keys import KeySpace
from coordinator.embedded import RedisServer
from coordinator.store.scripts import libraries_source, prelude
from coordinator.store.state_check import MAX_EXACT, canonical_int

KS = KeySpace()
ISSUE_VALUES = ["0x7fffffff", " 99999999", "1e8", "+99999999", "99999999.0", "0x1p30"]
SPACES = " \t\n\r\v\f"

# stored_num from lua/lib/numbers.lua, its verdict as a string: 'nil' (absent), 'false'
# (corrupt), or the number; and what plain tonumber makes of the same string.
_PROBE = prelude() + libraries_source(["numbers"]) + """
local v = stored_num(ARGV[1])
local t = tonumber(ARGV[1])
local seen = 'nil'
if t ~= nil then seen = string.format('%.17g', t) end
if v == false then return {'false', seen} end
return {string.format('%.0f', v), seen}
"""


@pytest.fixture(scope="module")
def probe(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


def _lua(client: redis.Redis, value: str) -> tuple[str, str]:
    verdict, seen = client.eval(_PROBE, 0, value)
    return str(verdict), str(seen)


def _digits() -> st.SearchStrategy[str]:
    return st.integers(min_value=0, max_value=10 ** 12).map(str)


def _tonumber_forms() -> st.SearchStrategy[str]:
    """Strings Lua's tonumber accepts that the project never writes."""
    n = st.integers(min_value=0, max_value=2 ** 40)
    space = st.text(alphabet=SPACES, min_size=1, max_size=3)
    return st.one_of(
        st.tuples(space, _digits()).map("".join),                      # leading space
        st.tuples(_digits(), space).map("".join),                      # trailing space
        _digits().map(lambda d: "+" + d),                              # plus sign
        st.integers(min_value=1, max_value=10 ** 12).map(lambda i: f"-{i}"),   # negative
        st.tuples(st.sampled_from(["0x", "0X"]), n).map(lambda t: f"{t[0]}{t[1]:x}"),
        n.map(lambda i: f"0x{i:X}"),
        st.tuples(st.integers(1, 9), st.integers(0, 15)).map(lambda t: f"{t[0]}e{t[1]}"),
        st.tuples(st.integers(1, 9), st.integers(0, 15)).map(lambda t: f"{t[0]}E+{t[1]}"),
        st.tuples(st.integers(1, 99), st.integers(0, 40)).map(lambda t: f"0x{t[0]}p{t[1]}"),
        _digits().map(lambda d: d + ".0"),                             # decimals
        _digits().map(lambda d: d + "."),
        _digits().map(lambda d: "0" + d),                              # leading zero
        st.integers(min_value=MAX_EXACT, max_value=10 ** 17).map(str),  # not exact in Lua
        st.sampled_from(ISSUE_VALUES + ["-0", "0.0", ".5", "5e-0", "00", "1e999"]),
    )


FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(_tonumber_forms())
def test_every_tonumber_form_is_corrupt_in_lua_and_python(probe: redis.Redis,
                                                         value: str) -> None:
    verdict, seen = _lua(probe, value)
    assert seen != "nil", f"Lua's tonumber rejects {value!r}: not a form to fuzz"
    assert verdict == "false", f"stored_num read {value!r} as {verdict}"
    assert canonical_int(value) is None


@FUZZ
@given(st.one_of(st.integers(min_value=0, max_value=MAX_EXACT - 1).map(str),
                 st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)))
def test_lua_and_python_agree(probe: redis.Redis, value: str) -> None:
    """The twin reads exactly what the script reads: canonical integers as themselves,
    every other string as corrupt."""
    verdict, _ = _lua(probe, value)
    python = canonical_int(value)
    assert verdict == ("false" if python is None else str(python))


def _config(usd: float) -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=usd, max_steps=100, max_retries_total=10)


def _spend(ctx: ExecutionContext, usd: float = 0.05) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


@pytest.mark.parametrize("value", ISSUE_VALUES)
@pytest.mark.parametrize("field", ["l:usd", "u:usd", "h:usd", "deadline"])
def test_a_non_canonical_number_never_lifts_the_ceiling(coord: Coordinator, field: str,
                                                        value: str) -> None:
    """Issue 25, case 3: three $0.05 calls under a $0.01 root whose field holds a number
    Lua's tonumber reads; none may run."""
    with ExecutionContext(_config(0.01)) as root:
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), field, value)
        assert [_spend(root) for _ in range(3)] == [Decision.HALT] * 3
        h = coord.client.hgetall(KS.ctx(root.chain_id, root.chain_id))
        assert (h["status"], h["reason"]) == ("stopped", "state_corrupt")
        assert field in h["detail"]
        snap = root.get_snapshot()
        assert snap.abort_reason == "state_corrupt" and snap.cost_usd_accumulated == 0


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_tonumber_forms(), field=st.sampled_from(["l:usd", "u:usd", "h:usd", "l:steps"]))
def test_fuzzed_field_stops_the_level(coord: Coordinator, value: str, field: str) -> None:
    with ExecutionContext(_config(0.01)) as root:
        child = root.spawn_child()
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), field, value)
        assert _spend(child) == Decision.HALT
        assert coord.client.hget(KS.ctx(root.chain_id, root.chain_id),
                                 "reason") == "state_corrupt"
        assert child.get_snapshot().cost_usd_accumulated == 0
        child.close()


def test_a_corrupt_amount_in_a_reservation_record_charges_nothing(coord: Coordinator
                                                                  ) -> None:
    """A reservation record whose held amount is a non-canonical number: the settle
    changes nothing and stops the caller's level, instead of releasing a wrong hold."""
    with ExecutionContext(_config(1.0)) as root:
        res_key = KS.reservations(root.chain_id)

        def body() -> None:
            (rid, raw), = coord.client.hgetall(res_key).items()
            coord.client.hset(res_key, rid, raw.replace('"usd",50000', '"usd","0x10"'))
            report_usage(cost_usd=0.04)

        assert root.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.05)) \
            == Decision.ALLOW
        coord.store.flush()
        h = coord.client.hgetall(KS.ctx(root.chain_id, root.chain_id))
        assert h["reason"] == "state_corrupt" and "reservation record" in h["detail"]
        assert h.get("u:usd", "0") == "0" and h["h:usd"] == "50000"


@pytest.mark.parametrize("value", ISSUE_VALUES)
def test_python_readers_never_read_a_non_canonical_number(coord: Coordinator,
                                                          value: str) -> None:
    """Snapshots, budgetctl and the views read what the scripts read: a non-canonical
    spend is 0, never the number Python's int() or Lua's tonumber would make of it."""
    with ExecutionContext(_config(1.0)) as root:
        coord.client.hset(KS.ctx(root.chain_id, root.chain_id), "u:usd", value)
        assert root.get_snapshot().cost_usd_accumulated == 0
        h, = coord.views.read_contexts([(root.chain_id, root.chain_id)])
        assert h["u:usd"] == "0"
