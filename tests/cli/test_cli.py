"""``budgetctl`` as an operator uses it: ids that round-trip, headers, sorting and "N more",
the stop shown on every context under it, --json, dates, dollars and plurals."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from coordinator import (
    ChainMetadata,
    Coordinator,
    ExecutionConfig,
    ExecutionContext,
    WrapOptions,
    report_usage,
)
from coordinator.cli import main
from tests.support.cli import budgetctl

Capture = pytest.CaptureFixture[str]


def _config(usd: float = 1.0, **kw: Any) -> ExecutionConfig:
    return ExecutionConfig(max_cost_usd=usd, max_steps=20, max_retries_total=3, **kw)


def _run(ctx_id: str | None = None, usd: float = 1.0, spend: float = 0.0,
         service: str = "agent", **kw: Any) -> ExecutionContext:
    meta = ChainMetadata(request_id=uuid.uuid4().hex, chain_id=ctx_id or str(uuid.uuid4()),
                         service=service, org_id="acme")
    run = ExecutionContext(_config(usd, **kw), metadata=meta)
    if spend:
        run.wrap_llm_call(lambda: report_usage(cost_usd=spend),
                          WrapOptions(cost_estimate_hint=spend))
    return run


def _top_ids(out: str) -> list[str]:
    """The TREE column of `top`'s table."""
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["TREE", "NAME"]
    assert "open tree" in lines[-1]  # the line under the table
    return [line.split()[0] for line in lines[1:-1]]


def test_an_id_printed_by_top_works_in_tree_and_abort(coord: Coordinator, redis_url: str,
                                                      capsys: Capture) -> None:
    run = _run(spend=0.25)
    child = run.spawn_child(max_cost_usd=0.5)
    code, out, _ = budgetctl(capsys, redis_url, "top")
    assert code == 0
    assert _top_ids(out) == [run.chain_id]  # the full id, not a cut one

    code, out, _ = budgetctl(capsys, redis_url, "tree", run.chain_id)
    assert code == 0 and run.chain_id in out and child.chain_id in out
    # an id printed by `tree` works too, and so does a unique start of an open tree's id
    code, out, _ = budgetctl(capsys, redis_url, "tree", child.chain_id)
    assert code == 0 and out.splitlines()[0].split()[1] == child.chain_id
    code, out, _ = budgetctl(capsys, redis_url, "tree", run.chain_id[:8])
    assert code == 0 and out.splitlines()[0].split()[1] == run.chain_id

    code, out, _ = budgetctl(capsys, redis_url, "abort", run.chain_id[:8], "ops said so")
    assert code == 0 and f"aborted {run.chain_id}" in out
    assert run.get_snapshot().abort_reason == "aborted"
    run.close()


def test_an_ambiguous_or_unknown_prefix_is_a_clear_error(coord: Coordinator, redis_url: str,
                                                         capsys: Capture) -> None:
    a, b = _run("job-a1"), _run("job-a2")
    _run("other")
    for command in ("tree", "abort"):
        code, out, err = budgetctl(capsys, redis_url, command, "job-a")
        assert code == 1 and out == ""
        assert "several open trees" in err and "job-a1" in err and "job-a2" in err
    assert a.get_snapshot().status == b.get_snapshot().status == "running"
    code, _, err = budgetctl(capsys, redis_url, "tree", "nope")
    assert code == 1 and "no context 'nope'" in err and "full id" in err
    # glob characters in a prefix are plain characters
    code, _, err = budgetctl(capsys, redis_url, "tree", "job-a*")
    assert code == 1 and "no context 'job-a*'" in err
    code, out, _ = budgetctl(capsys, redis_url, "tree", "job-a2")
    assert code == 0 and out.split()[1] == "job-a2"


def test_top_has_headers_sorts_and_says_how_many_it_left_out(
        coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    # spend: t2 > t4 > t1 > t3; fraction: t1 (0.15 of 0.2) > t4 > t2 > t3
    _run("t1", usd=0.2, spend=0.15)
    time.sleep(0.002)
    _run("t2", usd=5.0, spend=0.6)
    time.sleep(0.002)
    _run("t3", usd=1.0, spend=0.01)
    time.sleep(0.002)
    _run("t4", usd=0.5, spend=0.3)
    code, out, _ = budgetctl(capsys, redis_url, "top")
    assert code == 0
    assert out.splitlines()[0].split() == ["TREE", "NAME", "SPENT", "CEILING", "USED",
                                           "RESERVED", "CALLS", "AGE", "BURN/MIN", "STATUS"]
    assert _top_ids(out) == ["t2", "t4", "t1", "t3"]  # largest spend first by default
    assert "4 open trees, largest spend first" in out and "more" not in out
    code, out, _ = budgetctl(capsys, redis_url, "top", "--sort", "fraction")
    assert _top_ids(out) == ["t1", "t4", "t2", "t3"]
    code, out, _ = budgetctl(capsys, redis_url, "top", "--sort", "age", "--limit", "3")
    assert _top_ids(out) == ["t4", "t3", "t2"]
    assert "3 of 4 open trees, newest first; 1 more, use --limit" in out
    code, out, _ = budgetctl(capsys, redis_url, "top", "--limit", "1")
    assert _top_ids(out) == ["t2"] and "3 more, use --limit" in out
    code, _, err = budgetctl(capsys, redis_url, "top", "--sort", "name")
    assert code == 2 and "--sort" in err


def test_json_shapes(coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    run = _run("j1", usd=2.0, spend=0.25, service="planner")
    child = run.spawn_child(max_cost_usd=0.5)
    child.wrap_llm_call(lambda: report_usage(cost_usd=0.125))
    _run("j2", spend=0.01)

    code, out, _ = budgetctl(capsys, redis_url, "top", "--json", "--limit", "1")
    top = json.loads(out)
    assert code == 0 and (top["total"], top["shown"], top["more"], top["sort"]) == (
        2, 1, 1, "spend")
    tree_keys = {"id", "name", "status", "halted", "stop", "spent_usd", "reserved_usd",
                 "limit_usd", "fraction", "calls", "calls_refused", "call_outcomes",
                 "refusals", "last_refusal", "degraded_calls", "created_ms", "age_s",
                 "waiting_for_approval"}
    (first,) = top["trees"]
    assert set(first) == tree_keys | {"usd_per_min"}
    assert (first["id"], first["name"], first["spent_usd"], first["limit_usd"],
            first["calls"], first["stop"]) == ("j1", "planner", 0.375, 2.0, 2, None)

    run.abort("budget review")
    code, out, _ = budgetctl(capsys, redis_url, "tree", "j1", "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"read_at_ms", "tree", "recent_calls", "events"}
    root = doc["tree"]
    assert set(root) == tree_keys | {"children", "more_children"}
    assert root["stop"]["reason"] == "aborted" and root["stop"]["detail"] == "budget review"
    (kid,) = root["children"]
    assert (kid["id"], kid["status"], kid["halted"], kid["spent_usd"]) == (
        child.chain_id, "running", True, 0.125)
    assert set(kid["stop"]) == {"by", "reason", "detail", "at_ms", "recorded"}
    assert (kid["stop"]["by"], kid["stop"]["reason"]) == ("j1", "aborted")

    child.close()
    run.close()
    code, out, _ = budgetctl(capsys, redis_url, "spend", "--json")
    spend = json.loads(out)
    today = datetime.now(timezone.utc).date().isoformat()
    assert code == 0 and spend == {"day": today, "total_usd": 0.375, "unlabelled_usd": 0.0,
                                   "by": {"org": {"acme": 0.375}, "team": {},
                                          "service": {"planner": 0.375}},
                                   "models": [{"provider": None, "model": None,
                                               "usd": 0.375}]}


def test_every_context_under_an_abort_shows_who_stopped_it_and_why(
        coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    run = _run("r-abort")
    kid = run.spawn_child(max_cost_usd=0.5)
    grandkid = kid.spawn_child(max_cost_usd=0.1)
    finished = kid.spawn_child(max_cost_usd=0.1)
    finished.close()  # before the abort: nothing of it was halted
    sibling = run.spawn_child(max_cost_usd=0.2)
    code, out, _ = budgetctl(capsys, redis_url, "abort", kid.chain_id, "runaway loop")
    assert code == 0 and f"aborted {kid.chain_id} and its subtree: runaway loop" in out
    code, out, _ = budgetctl(capsys, redis_url, "tree", "r-abort")
    lines = out.splitlines()
    assert len(lines) == 5
    by_id = {ctx.chain_id: next(line for line in lines if ctx.chain_id in line.split())
             for ctx in (run, kid, grandkid, finished, sibling)}
    assert by_id["r-abort"].endswith("running")
    assert by_id[sibling.chain_id].endswith("running")
    assert by_id[kid.chain_id].endswith("stopped: aborted (runaway loop)")
    assert by_id[grandkid.chain_id].endswith(
        f"halted: aborted at {kid.chain_id} (runaway loop)")
    assert by_id[finished.chain_id].endswith("calls  closed")
    # asked for the grandchild alone, the stop above it is still shown
    code, out, _ = budgetctl(capsys, redis_url, "tree", grandkid.chain_id)
    assert out.strip().endswith(f"halted: aborted at {kid.chain_id} (runaway loop)")
    # without a reason, the operator is named
    code, out, _ = budgetctl(capsys, redis_url, "abort", sibling.chain_id)
    assert code == 0 and "aborted with budgetctl by " in out and "@" in out
    code, out, _ = budgetctl(capsys, redis_url, "abort", kid.chain_id)
    assert code == 0 and "was already aborted; nothing changed" in out


def test_every_context_under_a_timeout_shows_it(coord: Coordinator, redis_url: str,
                                                capsys: Capture) -> None:
    # recorded by this process's deadline timers, level by level
    run = _run("r-timed", timeout_ms=200)
    kid = run.spawn_child()
    grandkid = kid.spawn_child()
    # and a tree whose processes went away: the deadline passed, nobody recorded it
    gone = _run("r-gone", timeout_ms=200)
    gone_kid = gone.spawn_child()
    gone_kid.detach()
    gone.detach()
    time.sleep(0.5)
    code, out, _ = budgetctl(capsys, redis_url, "tree", "r-timed")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    for ctx, line in zip((run, kid, grandkid), lines, strict=True):
        assert ctx.chain_id in line and "timeout" in line and "running" not in line
    code, out, _ = budgetctl(capsys, redis_url, "tree", "r-gone")
    root_line, kid_line = out.splitlines()
    assert "halted: timeout (deadline passed" in root_line
    assert "halted: timeout at r-gone (deadline passed" in kid_line


def test_spend_day_is_validated(coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    _run("closed-today", spend=0.5, service="writer").close()
    today = datetime.now(timezone.utc).date()
    code, out, _ = budgetctl(capsys, redis_url, "spend")
    assert code == 0 and "writer" in out and "$0.5000" in out and today.isoformat() in out
    for day in ("today", today.isoformat()):
        assert budgetctl(capsys, redis_url, "spend", "--day", day)[1] == out
    code, out, _ = budgetctl(capsys, redis_url, "spend", "--day", "yesterday")
    yesterday = (today - timedelta(days=1)).isoformat()
    assert code == 0 and "writer" not in out and f"closed on {yesterday}" in out
    for bad in ("2026-13-45", "2026-02-30", "tomorrow", "2026-1-5", "26-11-2026", ""):
        code, out, err = budgetctl(capsys, redis_url, "spend", "--day", bad)
        assert code == 2 and out == "", bad
        assert "is not a day: give YYYY-MM-DD" in err, bad


def test_calls_are_counted_in_words_and_amounts_in_dollars(
        coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    run = _run("plural", usd=0.1)
    one = run.spawn_child(max_cost_usd=0.05)
    one.wrap_llm_call(lambda: report_usage(cost_usd=0.021203))
    two = run.spawn_child(max_cost_usd=0.05)
    for _ in range(2):
        two.wrap_llm_call(lambda: report_usage(cost_usd=0.01))
    run.spawn_child(max_cost_usd=0.01)
    # refused: its estimate does not fit what is left; the reason is told in dollars
    two.wrap_llm_call(lambda: None, WrapOptions(cost_estimate_hint=0.04))
    reason = two.get_snapshot().events[-1].reason
    assert reason == "usd needs $0.04, $0.03 of $0.05 left ($0.00 held by calls in flight)"

    code, out, _ = budgetctl(capsys, redis_url, "tree", "plural", "--calls", "0")
    assert code == 0
    calls = [re.search(r"(\d+ calls?)", line).group(1)  # type: ignore[union-attr]
             for line in out.splitlines()]
    assert calls[0] == "3 calls" and sorted(calls[1:]) == ["0 calls", "1 call", "2 calls"]
    assert "1 calls" not in out
    assert "$0.0412 / $0.1000" in out and "$0.0212 / $0.0500" in out
    code, out, _ = budgetctl(capsys, redis_url, "top")
    assert "3 calls" in out and "$0.0412" in out and "1 open tree," in out


def test_version_and_help(capsys: Capture) -> None:
    assert main(["--version"]) == 0
    assert re.fullmatch(r"budgetctl \S+\n", capsys.readouterr().out)
    assert main([]) in (0, 2)  # no command: the help
    out = capsys.readouterr().out
    for command in ("top", "tree", "abort", "spend", "demo"):
        assert command in out
