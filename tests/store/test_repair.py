"""Repair is a documented operation that loses nothing: after an operator fixed or reset a
corrupt field, ``budgetctl repair`` (and ``Coordinator.repair``) re-validates the level,
lifts its state_corrupt stop, and the spend the corruption left held is charged exactly
once, whether its settle had been refused or its worker died."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import (
    Coordinator,
    Decision,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from coordinator.core.keys import KeySpace
from coordinator.errors import ContextNotFoundError, CorruptStateError
from tests.support import procs
from tests.support.invariants import check_tree

KS = KeySpace()
SPAWN = mp.get_context("spawn")
LEASE_MS = 1000


@pytest.fixture
def short(redis_url: str) -> Iterator[Coordinator]:
    """A coordinator whose reservations expire after a second without renewal."""
    c = procs._coord(redis_url, lease_ms=LEASE_MS)
    yield c
    c.close()
    c.client.close()


def _config() -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=1.0, max_steps=100, max_retries_total=10)


def _hash(coord: Coordinator, root: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in coord.client.hgetall(KS.ctx(root, root)).items()}


def _cli(capsys: pytest.CaptureFixture[str], redis_url: str, *args: str
         ) -> tuple[int, str, str]:
    code = main(["--redis", redis_url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def _small_call(ctx: ExecutionContext) -> Decision:
    return ctx.wrap_llm_call(lambda: report_usage(cost_usd=0.001),
                             WrapOptions(cost_estimate_hint=0.001))


@pytest.mark.parametrize("fails", [False, True], ids=["settle", "release"])
def test_a_call_is_charged_once_across_corrupt_and_repair(
        short: Coordinator, redis_url: str, capsys: pytest.CaptureFixture[str],
        fails: bool) -> None:
    """Issue 25, case 4: a call reserved, a counter of its level was corrupted, then
    repaired. The call's $0.01 is charged once, the level runs again, close leaves
    nothing held."""
    client = short.client
    root = ExecutionContext(_config(), coordinator=short)
    key = KS.ctx(root.chain_id, root.chain_id)

    def body() -> None:
        client.hset(key, "u:usd", "abc")  # corrupted while the call runs
        report_usage(cost_usd=0.01)
        if fails:
            raise RuntimeError("provider 500")

    assert root.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.02)) \
        == (Decision.RETRY if fails else Decision.ALLOW)
    short.store.flush()
    h = _hash(short, root.chain_id)
    assert (h["status"], h["reason"]) == ("stopped", "state_corrupt")
    assert h["h:usd"] == "20000" and h["u:usd"] == "abc"

    client.hset(key, "u:usd", "0")  # the operator resets the counter
    time.sleep(LEASE_MS / 1000 + 0.2)
    assert _small_call(ExecutionContext.attach(root.token, coordinator=short)) \
        == Decision.HALT  # still stopped until repaired: nothing reaped, nothing charged
    assert _hash(short, root.chain_id)["u:usd"] == "0"

    code, out, err = _cli(capsys, redis_url, "repair", root.chain_id)
    assert code == 0, err
    assert "state_corrupt lifted" in out
    h = _hash(short, root.chain_id)
    assert h["status"] == "running" and "reason" not in h
    assert h["u:usd"] == "10000" and h["h:usd"] == "0"
    assert h.get("u:steps", "0") == ("0" if fails else "1")
    assert h.get("u:retries", "0") == ("1" if fails else "0")
    events = [json.loads(e)["event_type"]
              for e in client.lrange(KS.events(root.chain_id, root.chain_id), 0, -1)]
    assert events.count("state_repaired") == 1

    # the reaping reserve of a later call finds nothing more to charge
    later = ExecutionContext.attach(root.token, coordinator=short)
    assert _small_call(later) == Decision.ALLOW
    root.close()
    assert check_tree(client, root.chain_id) == 10_000 + 1_000
    assert client.hlen(KS.reservations(root.chain_id)) == 0


def test_a_dead_workers_call_is_reaped_once_after_repair(
        short: Coordinator, redis_url: str) -> None:
    """A worker died holding a $0.30 call while a counter of the root was corrupt: the
    reaping reserve is refused until the repair, then charges the estimate once."""
    client = short.client
    root = ExecutionContext(_config(), coordinator=short)
    key = KS.ctx(root.chain_id, root.chain_id)
    ready = SPAWN.Event()
    worker = SPAWN.Process(target=procs.hold_call,
                           args=(redis_url, root.token, LEASE_MS, ready))
    worker.start()
    assert ready.wait(60)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    client.hset(key, "l:steps", "0x64")
    time.sleep(LEASE_MS / 1000 + 0.2)
    assert _small_call(root) == Decision.HALT  # the corrupt limit stops the level
    assert _hash(short, root.chain_id)["h:usd"] == "300000"  # not reaped while stopped

    client.hset(key, "l:steps", "100")
    done = short.repair(root.chain_id, operator="the test")
    assert done.lifted and done.status == "running" and done.charged == []
    later = ExecutionContext.attach(root.token, coordinator=short)
    assert _small_call(later) == Decision.ALLOW  # reaps the dead worker's call
    short.store.flush()
    h = _hash(short, root.chain_id)
    assert h["u:usd"] == str(300_000 + 1_000) and h["h:usd"] == "0"
    root.close()
    assert check_tree(client, root.chain_id) == 301_000


def test_repair_refuses_while_a_number_is_still_corrupt(short: Coordinator,
                                                       redis_url: str,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with ExecutionContext(_config(), coordinator=short) as root:
        key = KS.ctx(root.chain_id, root.chain_id)
        short.client.hset(key, "u:usd", "1e8")
        assert _small_call(root) == Decision.HALT
        short.store.flush()  # the refusal's record (its count on the hash) is written behind
        before = _hash(short, root.chain_id)
        with pytest.raises(CorruptStateError) as err:
            short.repair(root.chain_id)
        assert err.value.field == "u:usd" and err.value.value == "1e8"
        code, _, stderr = _cli(capsys, redis_url, "repair", root.chain_id)
        assert code == 1 and "u:usd holds '1e8'" in stderr
        assert _hash(short, root.chain_id) == before  # nothing changed
        with pytest.raises(ContextNotFoundError):
            short.repair("no-such-context")


def test_repair_resets_holds_to_what_is_held(short: Coordinator) -> None:
    """An operator who reset a corrupt hold to 0 loses nothing: the repair sets it back to
    what the open reservations hold; a valid running level is left running."""
    with ExecutionContext(_config(), coordinator=short) as root:
        key = KS.ctx(root.chain_id, root.chain_id)

        def body() -> None:
            short.client.hset(key, "h:usd", "0")  # reset while a $0.02 call is held
            done = short.repair(root.chain_id)
            assert not done.lifted and done.status == "running"
            assert done.holds == {"h:usd": (0, 20_000)}
            report_usage(cost_usd=0.01)

        assert root.wrap_llm_call(body, WrapOptions(cost_estimate_hint=0.02)) \
            == Decision.ALLOW
        short.store.flush()
        h = _hash(short, root.chain_id)
        assert h["u:usd"] == "10000" and h["h:usd"] == "0"


def test_the_documented_example_runs(coord: Coordinator,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """docs/topology.md, "Repairing corrupt state": its Python block, as written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "topology.md").read_text()
    section = text.split("## Repairing corrupt state")[1]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    exec(compile(block, "topology.md repair example", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out.split() == ["running"]
