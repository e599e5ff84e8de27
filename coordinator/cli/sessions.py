"""``budgetctl sessions``: list active execution sessions and clean up expired ones::

    budgetctl sessions list [--tenant T] [--json]  active sessions, soonest to expire first
    budgetctl sessions cleanup [--provider]  expire sessions past their TTL, kill sandboxes

The sessions code (and the ``sessions`` extra it needs: Jupyter, OpenTelemetry) is
imported by the commands only, so ``budgetctl`` runs without that extra.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import typer

from ..core.durations import human_age
from ..core.session_models import ExecutionSession
from ..store.sessions import SessionStore
from ._common import connect, fail
from .help_format import PlainCommand, PlainGroup

if TYPE_CHECKING:
    from ..sessions.providers.base import SandboxProvider

app = typer.Typer(cls=PlainGroup, help="Execution sessions: sandboxes of conversation paths.",
                  no_args_is_help=True)


def _provider(name: str) -> SandboxProvider:
    if name == "e2b":
        from ..sessions.providers.e2b import E2BProvider
        return E2BProvider()
    from ..sessions.providers.local import LocalKernelProvider
    return LocalKernelProvider()


def session_json(s: ExecutionSession) -> dict[str, Any]:
    """The stable JSON shape of one session in ``sessions list --json`` (docs/cli.md)."""
    return {"tenant": s.identity.tenant_id, "conversation": s.identity.conversation_id,
            "path": s.identity.path_id, "provider": s.provider, "sandbox_id": s.sandbox_id,
            "host": s.host, "status": s.status, "execution_count": s.execution_count,
            "total_execution_ms": s.total_execution_time_ms,
            "created_at": s.created_at.isoformat(), "last_used_at": s.last_used_at.isoformat(),
            "expires_at": s.expires_at.isoformat(), "budget_root": s.budget_root}


@app.command("list", cls=PlainCommand)
def list_sessions(
    ctx: typer.Context,
    tenant: str | None = typer.Option(None, "--tenant", metavar="TENANT",
                                      help="Only this tenant."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (shape: docs/cli.md)."),
) -> None:
    """Active sessions: tenant, conversation, path, sandbox, executions, expiry."""
    with connect(ctx) as coord:
        store = SessionStore.for_coordinator(coord)
        now = datetime.now(timezone.utc)
        found = [s for t in ([tenant] if tenant else store.tenants())
                 for s in (store.load(i) for i in store.list_active_for_tenant(t)) if s]
    if json_out:
        typer.echo(json.dumps({"sessions": [session_json(s) for s in found]}, indent=2))
        return
    for s in found:
        left = max(0, int((s.expires_at - now).total_seconds()))
        typer.echo(f"{s.identity.tenant_id}  {s.identity.conversation_id}  "
                   f"{s.identity.path_id}  "
                   f"{s.provider}:{s.sandbox_id}{'@' + s.host if s.host else ''}  "
                   f"{s.execution_count} runs  {s.total_execution_time_ms} ms  "
                   f"expires in {human_age(left * 1000)}")
    if not found:
        typer.echo("no active sessions")


@app.command("cleanup", cls=PlainCommand)
def cleanup(
    ctx: typer.Context,
    provider: str = typer.Option("local", "--provider",
                                 help="Who kills the sandboxes: local (kernels of this "
                                      "host) or e2b."),
) -> None:
    """Expire every active session past its TTL (Redis time) and kill its sandbox; mark
    error the active sessions whose sandbox is gone (local: a kernel of this host whose
    process ended)."""
    if provider not in ("local", "e2b"):
        fail(f"--provider must be local or e2b, not {provider!r}", 2)
    from ..sessions.manager import SessionManager  # needs the sessions extra

    with connect(ctx) as coord:
        manager = SessionManager(coord, _provider(provider))
        try:
            count = manager.cleanup_expired()
            lost = sum(manager.reap_lost(t) for t in manager.store.tenants())
        finally:
            manager.detach()
        typer.echo(f"{count} expired session{'s' if count != 1 else ''} cleaned up")
        if lost:
            typer.echo(f"{lost} session{'s' if lost != 1 else ''} whose sandbox is gone "
                       "marked error")
