"""``budgetctl`` as the README shows it to a new operator: an unquoted abort reason, usage
lines without metavars that are not words, ``gc`` as its help says, ``sessions list
--json``, and the development-key warning once per Redis (issue 23, items 9 and 14)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import typer
from typer.core import TyperGroup

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.cli import app, main
from coordinator.cli.rows import own_stop

Capture = pytest.CaptureFixture[str]


def _cli(capsys: Capture, redis_url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--redis", redis_url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def _root() -> ExecutionContext:
    return ExecutionContext(ExecutionConfig(max_cost_usd=1.0, max_steps=10,
                                            max_retries_total=2))


def test_abort_takes_the_rest_of_the_line_as_the_reason(coord: Coordinator, redis_url: str,
                                                        capsys: Capture) -> None:
    run = _root()
    code, out, err = _cli(capsys, redis_url, "abort", run.chain_id, "loops", "on", "the",
                          "same", "query")
    assert (code, err) == (0, "")
    assert out == f"aborted {run.chain_id} and its subtree: loops on the same query\n"
    snap = run.get_snapshot()
    assert snap.abort_reason == "aborted"
    assert any(e.reason.endswith("loops on the same query") for e in snap.events)


def test_abort_with_a_quoted_reason_and_redis_after_it(coord: Coordinator, redis_url: str,
                                                       capsys: Capture) -> None:
    run = _root()
    code = main(["abort", run.chain_id, "operator pressed stop", "--redis", redis_url])
    out, _ = capsys.readouterr()
    assert code == 0 and out.endswith(": operator pressed stop\n")


def _commands(group: TyperGroup, path: list[str]) -> Iterator[list[str]]:
    yield path
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from _commands(command, [*path, name])
        else:
            yield [*path, name]


ROOT = typer.main.get_command(app)
assert isinstance(ROOT, TyperGroup)
COMMANDS = list(_commands(ROOT, []))
TYPE_TAG = re.compile(r"<[a-z][^>]*>")
"""Typer's type placeholders: ``<bool>``, ``<str>``, ``<int range>``, ``<list[str]>``."""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "budgetctl")
def test_help_has_no_type_tags_and_no_braces_nor_cut_text(
        command: list[str], capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert not TYPE_TAG.search(out) and "{" not in out, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    if command == ["tree"]:
        assert usage.split() == ["Usage:", "budgetctl", "tree", "[OPTIONS]", "ID"]
    if command == ["abort"]:
        assert usage.split()[-2:] == ["ID", "[REASON]..."]
    if command == ["gc"]:
        assert "--watch" not in out  # gc has none


def test_gc_dry_run_counts_the_open_trees(coord: Coordinator, redis_url: str,
                                          capsys: Capture) -> None:
    runs = [_root(), _root()]
    code, out, _ = _cli(capsys, redis_url, "gc", "--dry-run")
    assert code == 0
    assert out.strip() == ("0 trees idle for 1d00h or more among 2 open trees (0 created "
                           "1d00h or more ago); dry run: nothing changed (run without "
                           "--dry-run to close and expire them)")
    code, out, _ = _cli(capsys, redis_url, "gc", "--dry-run", "--json")
    assert json.loads(out)["open"] == 2
    for run in runs:
        run.close()


def test_sessions_list_has_json(coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    from coordinator.sessions import ExecutionSession, ExecutionSessionIdentity, SessionStore

    code, out, _ = _cli(capsys, redis_url, "sessions", "list", "--json")
    assert code == 0 and json.loads(out) == {"sessions": []}
    store = SessionStore.for_coordinator(coord)
    who = ExecutionSessionIdentity(tenant_id="acme", conversation_id="c-1", path_id="main")
    now = datetime.now(timezone.utc)
    store.save(who, ExecutionSession(
        identity=who, sandbox_id="sb-1", provider="local", created_at=now, last_used_at=now,
        updated_at=now, expires_at=now + timedelta(minutes=10), status="active",
        ttl_ms=600_000))
    code, out, _ = _cli(capsys, redis_url, "sessions", "list", "--json")
    [row] = json.loads(out)["sessions"]
    assert code == 0
    assert {k: row[k] for k in ("tenant", "conversation", "path", "sandbox_id", "status")} \
        == {"tenant": "acme", "conversation": "c-1", "path": "main", "sandbox_id": "sb-1",
            "status": "active"}
    assert datetime.fromisoformat(row["expires_at"]) > now


def test_a_deadline_passed_long_ago_reads_as_a_duration() -> None:
    stop = own_stop("c", {"status": "running", "deadline": "1000"}, 1000 + 7_260_000)
    assert stop is not None and stop.detail == "deadline passed 2h01m ago"
