"""``budgetctl sessions``: list active execution sessions and clean up expired ones::

    budgetctl sessions list [--tenant T]     active sessions, soonest to expire first
    budgetctl sessions cleanup [--provider]  expire sessions past their TTL, kill sandboxes

The sessions code (and the ``sessions`` extra it needs: Jupyter, OpenTelemetry) is
imported by the commands only, so ``budgetctl`` runs without that extra.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import typer

from ..store.sessions import SessionStore
from ._common import connect, fail

if TYPE_CHECKING:
    from ..sessions.providers.base import SandboxProvider

app = typer.Typer(help="Execution sessions: sandboxes of conversation paths.",
                  no_args_is_help=True)


def _provider(name: str) -> SandboxProvider:
    if name == "e2b":
        from ..sessions.providers.e2b import E2BProvider
        return E2BProvider()
    from ..sessions.providers.local import LocalKernelProvider
    return LocalKernelProvider()


@app.command("list")
def list_sessions(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
) -> None:
    """Active sessions: tenant, conversation, path, sandbox, executions, expiry."""
    with connect(ctx) as coord:
        store = SessionStore.for_coordinator(coord)
        now = datetime.now(timezone.utc)
        rows = 0
        for t in [tenant] if tenant else store.tenants():
            for identity in store.list_active_for_tenant(t):
                s = store.load(identity)
                if s is None:
                    continue
                left = max(0, int((s.expires_at - now).total_seconds()))
                typer.echo(f"{t}  {identity.conversation_id}  {identity.path_id}  "
                           f"{s.provider}:{s.sandbox_id}{'@' + s.host if s.host else ''}  "
                           f"{s.execution_count} runs  {s.total_execution_time_ms} ms  "
                           f"expires in {left} s")
                rows += 1
        if rows == 0:
            typer.echo("no active sessions")


@app.command("cleanup")
def cleanup(
    ctx: typer.Context,
    provider: str = typer.Option("local", "--provider",
                                 help="Who kills the sandboxes: local (kernels of this "
                                      "host) or e2b."),
) -> None:
    """Expire every active session past its TTL (Redis time) and kill its sandbox."""
    if provider not in ("local", "e2b"):
        fail(f"--provider must be local or e2b, not {provider!r}", 2)
    from ..sessions.manager import SessionManager  # needs the sessions extra

    with connect(ctx) as coord:
        manager = SessionManager(coord, _provider(provider))
        try:
            count = manager.cleanup_expired()
        finally:
            manager.close()
        typer.echo(f"{count} expired session{'s' if count != 1 else ''} cleaned up")
