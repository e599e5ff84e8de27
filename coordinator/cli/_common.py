"""What every budgetctl command shares: the Redis it talks to, the console, the errors
it reports (and their exit codes), and the --watch loop."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from ..core.redaction import redact_url
from ..core.session_errors import SessionStoreUnavailableError
from ..errors import (
    BackendConfigError,
    BackendUnavailableError,
    BudgetCoordinatorError,
    TopologySettingError,
)
from ..runtime.coordinator import Coordinator
from ..runtime.settings import default_url
from ..store.errors import RedisError

DEFAULT_WATCH_S = 2.0
"""The refresh interval of a bare ``--watch``."""

JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print JSON (shapes: docs/cli.md); with --watch, one line per refresh.")]
WatchOption = Annotated[float | None, typer.Option(
    "--watch", metavar="[SECONDS]", min=0.1, max=86400.0,
    help=f"Redraw every SECONDS (bare --watch: every {DEFAULT_WATCH_S:g}); Ctrl-C ends.")]


def console() -> Console:
    """The console of stdout. Piped, it is wide enough that no id is cut or wrapped."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=1000 if wide else None)


UNAVAILABLE = (RedisError, BackendUnavailableError, SessionStoreUnavailableError)
"""What a read raises when Redis does not answer."""


def why_unavailable(exc: BaseException) -> BaseException:
    """What did not answer, without the wrapper's own "Redis unavailable during ..."."""
    return exc.cause if isinstance(exc, (BackendUnavailableError,
                                          SessionStoreUnavailableError)) else exc


def unavailable_text(url: str, exc: BaseException) -> str:
    """``Redis unavailable at URL (what failed): start it, or ...``, password hidden."""
    cause = str(why_unavailable(exc)).rstrip(".")
    return redact_url(f"Redis unavailable at {url} ({cause}): start it, or name another "
                      f"with --redis URL")


def fail(message: str, code: int) -> NoReturn:
    """Print ``budgetctl: message`` on stderr and exit with ``code``."""
    print(f"budgetctl: {message}", file=sys.stderr)
    raise typer.Exit(code)


def redis_url(ctx: typer.Context) -> str | None:
    """The ``--redis`` given to budgetctl (before or after the command), if any."""
    url = ctx.find_root().params.get("redis")
    return str(url) if url else None


@contextlib.contextmanager
def connect(ctx: typer.Context) -> Iterator[Coordinator]:
    """A coordinator on the Redis of ``--redis``, else ``BUDGET_REDIS_URL``, ``REDIS_URL``,
    ``redis://localhost:6379/0``. A missing context or an ambiguous id exits 1; Redis
    unavailable, misconfigured (``BackendConfigError``) or a URL that cannot work
    (``TopologyURLError``) exits 2."""
    url = redis_url(ctx) or default_url()
    coord: Coordinator | None = None
    try:
        coord = Coordinator.from_url(url)
        yield coord
    except UNAVAILABLE as exc:
        fail(unavailable_text(url, exc), 2)
    except (BackendConfigError, TopologySettingError) as exc:  # the URL or its server is wrong
        fail(str(exc), 2)
    except BudgetCoordinatorError as exc:
        fail(redact_url(str(exc)), 1)
    finally:
        if coord is not None:
            coord.close()


def print_json(read: Callable[[], Any], watch_s: float | None) -> None:
    """``read()`` as one JSON document on stdout; with ``watch_s``, one compact document
    per line every ``watch_s`` seconds (JSON lines) until Ctrl-C."""
    if watch_s is None:
        sys.stdout.write(json.dumps(read(), indent=2, ensure_ascii=False) + "\n")
        return
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            sys.stdout.write(json.dumps(read(), ensure_ascii=False) + "\n")
            sys.stdout.flush()
            time.sleep(watch_s)


def show(render: Callable[[], RenderableType], watch_s: float | None, title: str) -> None:
    """Print ``render()`` once, or redraw it every ``watch_s`` seconds until Ctrl-C (in
    place on a terminal; one frame after another when piped). A failing read is shown in
    the frame and retried at the next refresh."""
    out = console()
    if watch_s is None:
        out.print(render())
        return

    def frame() -> RenderableType:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        head = Text(f"{title} · every {watch_s:g}s · {stamp} · Ctrl-C to stop", style="dim")
        try:
            body = render()
        except UNAVAILABLE as exc:
            body = Text(f"Redis unavailable: {why_unavailable(exc)}; retrying", style="red")
        return Group(head, body)

    with contextlib.suppress(KeyboardInterrupt):
        if not out.is_terminal:
            while True:
                out.print(frame())
                out.print()
                out.file.flush()
                time.sleep(watch_s)
        with Live(frame(), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(watch_s)
                live.update(frame(), refresh=True)
