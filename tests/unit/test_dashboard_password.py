"""A hashed dashboard password mangled by the shell is refused at start, clearly (issue 23,
item 12), and the documented single-quoted form keeps it whole."""

from __future__ import annotations

import subprocess

import pytest

from coordinator.dashboard import Auth, hash_password
from coordinator.dashboard.command import main


def _through_bash(quote: str, value: str) -> str:
    """What ``export BUDGET_DASHBOARD_USERS=<quote>value<quote>`` leaves in the variable."""
    script = f"export BUDGET_DASHBOARD_USERS={quote}{value}{quote}; " \
             'printf %s "$BUDGET_DASHBOARD_USERS"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          check=True).stdout


def test_a_hash_expanded_by_the_shell_is_refused(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    hashed = hash_password("s3cret")
    mangled = _through_bash('"', f"alice:operator:{hashed}")
    assert "$" not in mangled and mangled.startswith("alice:operator:pbkdf2_sha256")
    with pytest.raises(ValueError, match="single quotes") as err:
        Auth.parse(mangled)
    assert "alice" in str(err.value) and mangled.split(":")[2] not in str(err.value)
    monkeypatch.setenv("BUDGET_DASHBOARD_USERS", mangled)
    assert main(["--port", "1"]) == 2  # refused before anything binds or connects
    assert "looks like a broken pbkdf2_sha256 hash" in capsys.readouterr().err


def test_the_single_quoted_hash_logs_in() -> None:
    hashed = hash_password("s3cret")
    kept = _through_bash("'", f"alice:operator:{hashed}")
    auth = Auth.parse(kept)
    assert auth.login("alice", "s3cret") is not None
    assert auth.login("alice", "wrong") is None
    assert Auth.parse("bob:viewer:plain-password").login("bob", "plain-password")
