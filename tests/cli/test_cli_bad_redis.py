"""Every ``budgetctl`` command that takes ``--redis`` exits 2 (bad usage or Redis
unavailable, docs/cli.md) for a URL that cannot work and for a Redis that does not
answer, naming the URL with its password hidden (issue 29, item 16)."""

from __future__ import annotations

import socket

import pytest

from coordinator.cli import main
from tests.cli.test_cli_first_steps import COMMANDS

ARGS = {("tree",): ["x"], ("abort",): ["x"], ("repair",): ["x"],
        ("limit",): ["x", "--usd", "1", "--reason", "approved"],
        ("quota", "set"): ["q", "--match", "team=a", "--usd", "1"],
        ("quota", "show"): ["q"], ("quota", "delete"): ["q"]}
"""The arguments a command needs to get as far as Redis."""
LEAVES = [c for c in COMMANDS if c and not any(d[:len(c)] == c != d for d in COMMANDS)]
"""The commands (not their groups)."""
SERVERS = {("dashboard",), ("alerts",)}
"""Commands that keep running while Redis is away (they retry): only a bad URL ends them."""


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://:s3cret@127.0.0.1:{port}/0"  # nothing listens there any more


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_a_url_that_cannot_work_exits_2(command: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*command, *ARGS.get(tuple(command), []), "--redis",
                 "http://alice:s3cret@x:1/0"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("budgetctl: ") and "http://alice:**@x:1/0" in err, err
    assert "s3cret" not in err and "Traceback" not in err


@pytest.mark.parametrize("command", [c for c in LEAVES if tuple(c) not in SERVERS],
                         ids=" ".join)
def test_a_redis_that_does_not_answer_exits_2(command: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = _dead_url()
    code = main([*command, *ARGS.get(tuple(command), []), "--redis", url])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("budgetctl: ") and "127.0.0.1" in err and "s3cret" not in err, err
