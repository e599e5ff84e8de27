"""``budgetctl``: the operator's command line (Typer + Rich), one module per command
group, each a ``typer.Typer()`` registered below.

    budgetctl top [--sort spend|fraction|age] [--limit N] [--json] [--watch [S]]
    budgetctl tree ID [--json] [--watch [S]]
    budgetctl abort ID [REASON]...
    budgetctl limit ID [--usd X] [--steps N] [--retries N] [--tokens N] --reason TEXT
                    [--actor WHO] [--json]
    budgetctl repair ID
    budgetctl spend [--day YYYY-MM-DD|today|yesterday] [--json]
    budgetctl gc [--idle SECONDS] [--dry-run] [--json]
    budgetctl demo
    budgetctl sessions list [--tenant T] [--json] | cleanup [--provider local|e2b]
    budgetctl dashboard [--host 127.0.0.1] [--port 8700]
    budgetctl alerts
    budgetctl quota set ID [--match L=V] [--usd X] [--unset usd] ... | list | show ID | delete ID

``--redis URL`` goes before or after the command (else ``BUDGET_REDIS_URL``,
``REDIS_URL``, ``redis://localhost:6379/0``). Exit codes: 0 done, 1 no such context (or
an ambiguous id), 2 bad usage or Redis unavailable. Reference: docs/cli.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from . import abort, dashboard, demo, gc, limit, quota, repair, sessions, spend, top, tree
from ._common import DEFAULT_WATCH_S
from .help_format import PlainGroup

app = typer.Typer(name="budgetctl", cls=PlainGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="Watch and stop budget trees in Redis; run the demo.")

# A command group is a typer.Typer() in its own module, registered with one line: without
# a name its commands are budgetctl's own, with name="sessions" they form a group.
for group in (top.app, tree.app, abort.app, limit.app, repair.app, spend.app, gc.app, demo.app,
              dashboard.app):
    app.add_typer(group)
app.add_typer(sessions.app, name="sessions")
app.add_typer(quota.app, name="quota")


def _version(value: bool) -> None:
    if value:
        try:
            print(f"budgetctl {version('budget-coordinator')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("budgetctl (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    redis: Annotated[str | None, typer.Option(
        "--redis", metavar="URL", help="Redis URL, before or after the command (default: "
        "BUDGET_REDIS_URL, REDIS_URL, redis://localhost:6379/0).")] = None,
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """Watch and stop budget trees in Redis; run the demo."""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def normalise(argv: Sequence[str]) -> list[str]:
    """``--redis URL`` moved in front of the command wherever it was given (so every
    command, and every group registered later, takes it after itself too), and a bare
    ``--watch`` given its default interval."""
    out: list[str] = []
    url: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg == "--redis" and i + 1 < len(args):
            url = ["--redis", args[i + 1]]
            i += 2
            continue
        if arg.startswith("--redis="):
            url = ["--redis", arg.split("=", 1)[1]]
        elif arg == "--watch" and (i + 1 == len(args) or not _is_number(args[i + 1])):
            out += ["--watch", str(DEFAULT_WATCH_S)]
        else:
            out.append(arg)
        i += 1
    return url + out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``budgetctl``; returns the exit code."""
    command = typer.main.get_command(app)
    try:
        command.main(args=normalise(sys.argv[1:] if argv is None else argv),
                     prog_name="budgetctl")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
