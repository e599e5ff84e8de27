"""``budgetctl limit``: an operator raises a ceiling that stopped a tree (the stop lifted in
the process that runs it, the change audited), lowers one below the spend, and bad values,
unknown ids and closed trees change nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

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
from tests.support.cli import budgetctl

Capture = pytest.CaptureFixture[str]


def _run(ctx_id: str, usd: float = 0.05) -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=usd, max_steps=20, max_retries_total=3),
                            metadata=ChainMetadata(request_id=uuid.uuid4().hex, chain_id=ctx_id))


def _spend(run: ExecutionContext, usd: float) -> Decision:
    return run.wrap_llm_call(lambda: report_usage(cost_usd=usd),
                             WrapOptions(cost_estimate_hint=usd))


def _changes(run: ExecutionContext) -> list[dict[str, object]]:
    """The metadata of the limits_changed events of ``run``."""
    return [dict(e.metadata) for e in run.get_snapshot().events
            if e.event_type == "limits_changed"]


def test_a_raise_from_another_process_lifts_the_ceiling_stop(coord: Coordinator,
                                                             redis_url: str) -> None:
    run = _run("approve-me")
    assert _spend(run, 0.05) == Decision.ALLOW
    assert _spend(run, 0.01) == Decision.HALT  # the ceiling stops the tree
    assert run.get_snapshot().abort_reason == "budget_exceeded"
    coord.store.flush()
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "--redis", redis_url,
                           "limit", "approve-me", "--usd", "0.10", "--reason", "approved"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "approve-me: max_cost_usd $0.05 -> $0.10"
    assert lines[1] == "lifted budget_exceeded: running again"
    assert lines[2].startswith("by ") and "@" in lines[2] and lines[2].endswith(": approved")
    # this process heard the lift (over the stop channel) and calls again under $0.10
    deadline = time.monotonic() + 2.0
    while run.stop_reason is not None:
        assert time.monotonic() < deadline, "the lift was not heard within 2 s"
        time.sleep(0.01)
    assert _spend(run, 0.04) == Decision.ALLOW
    assert _spend(run, 0.02) == Decision.HALT  # and stops again at the new ceiling
    [change] = _changes(run)
    assert change["reason"] == "approved" and change["lifted"] == "budget_exceeded"
    assert change["limits"] == {"usd": {"before": 50_000, "after": 100_000}}
    run.close()


def test_lowering_below_the_spend_stops_and_json_says_so(coord: Coordinator, redis_url: str,
                                                         capsys: Capture) -> None:
    run = _run("lower-me", usd=1.0)
    assert _spend(run, 0.2) == Decision.ALLOW
    code, out, err = budgetctl(capsys, redis_url, "limit", "lower-me", "--usd", "0.10",
                          "--steps", "9", "--reason", "too much", "--actor", "ops-oncall",
                          "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "ctx_id": "lower-me", "actor": "ops-oncall", "reason": "too much",
        "changes": [{"limit": "max_cost_usd", "before": 1.0, "after": 0.1},
                    {"limit": "max_steps", "before": 20, "after": 9}],
        "lifted": [], "stopped": True, "stop_reason": "budget_exceeded"}
    assert run.get_snapshot().status == "stopped"
    assert _changes(run)[0]["actor"] == "ops-oncall"
    run.close()


@pytest.mark.parametrize("option, value", [
    ("--usd", "nan"), ("--usd", "NaN"), ("--usd", "-1"), ("--usd", "0x10"),
    ("--usd", "1e400"), ("--usd", "1e2"), ("--usd", "two"), ("--usd", "1_000"),
    ("--usd", " 1"), ("--usd", "0.0000001"), ("--usd", "0"), ("--usd", "2000000000"),
    ("--steps", "1.5"), ("--steps", "-3"), ("--steps", "0"), ("--steps", "010"),
    ("--retries", "inf"), ("--tokens", "0x20"),
])
def test_a_bad_value_exits_2_and_changes_nothing(coord: Coordinator, redis_url: str,
                                                 capsys: Capture, option: str,
                                                 value: str) -> None:
    run = _run("keep-me")
    code, out, err = budgetctl(capsys, redis_url, "limit", "keep-me", option, value,
                          "--reason", "typo")
    assert code == 2 and out == ""
    assert err.startswith("budgetctl: ") and (option in err or option[2:] in err), err
    snap = run.get_snapshot()
    assert snap.max_cost_usd == 0.05 and snap.max_steps == 20
    assert _changes(run) == []
    run.close()


def test_unknown_closed_and_empty_changes_are_refused(coord: Coordinator, redis_url: str,
                                                      capsys: Capture) -> None:
    code, out, err = budgetctl(capsys, redis_url, "limit", "nope", "--usd", "1", "--reason", "x")
    assert code == 2 and out == "" and "no context 'nope'" in err  # bad input, as a bad value
    run = _run("done-run")
    code, _, err = budgetctl(capsys, redis_url, "limit", "done-run", "--reason", "x")
    assert code == 2 and "nothing to change" in err
    code, _, err = budgetctl(capsys, redis_url, "limit", "done-run", "--usd", "1")
    assert code == 2 and "--reason" in err
    run.close()
    code, out, err = budgetctl(capsys, redis_url, "limit", "done-run", "--usd", "1",
                          "--reason", "x")
    assert code == 2 and out == "" and "'done-run' is closed" in err
    assert ExecutionContext.load_snapshot("done-run", coord).max_cost_usd == 0.05
