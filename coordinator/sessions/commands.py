"""``budgetctl sessions``: list active execution sessions and clean up expired ones (a
Typer sub-app; the CLI registers it as the ``sessions`` group)::

    budgetctl sessions list [--tenant T]     active sessions, soonest to expire first
    budgetctl sessions cleanup [--provider]  expire sessions past their TTL, kill sandboxes

Until the CLI registers it: ``python -m coordinator.sessions.commands list``.
"""

from __future__ import annotations

from datetime import datetime, timezone

import typer

from ..core.session_errors import SessionError
from ..runtime.coordinator import Coordinator
from ..runtime.settings import default_url
from ..store.sessions import SessionStore
from .manager import SessionManager
from .providers.base import SandboxProvider

app = typer.Typer(help="Execution sessions: sandboxes of conversation paths.",
                  no_args_is_help=True)


def _coordinator(redis_url: str | None) -> Coordinator:
    return Coordinator.from_url(redis_url or default_url())


def _provider(name: str) -> SandboxProvider:
    if name == "e2b":
        from .providers.e2b import E2BProvider
        return E2BProvider()
    from .providers.local import LocalKernelProvider
    return LocalKernelProvider()


REDIS_OPTION = typer.Option(None, "--redis", help="Redis URL (default: BUDGET_REDIS_URL, "
                            "REDIS_URL, redis://localhost:6379/0)")


@app.command("list")
def list_sessions(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
    redis_url: str | None = REDIS_OPTION,
) -> None:
    """Active sessions: tenant, conversation, path, sandbox, executions, expiry."""
    coord = _coordinator(redis_url)
    try:
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
    except SessionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        coord.close()


@app.command("cleanup")
def cleanup(
    provider: str = typer.Option("local", "--provider",
                                 help="Who kills the sandboxes: local (kernels of this "
                                      "host) or e2b."),
    redis_url: str | None = REDIS_OPTION,
) -> None:
    """Expire every active session past its TTL (Redis time) and kill its sandbox."""
    if provider not in ("local", "e2b"):
        typer.echo(f"error: --provider must be local or e2b, not {provider!r}", err=True)
        raise typer.Exit(2)
    coord = _coordinator(redis_url)
    manager = SessionManager(coord, _provider(provider))
    try:
        count = manager.cleanup_expired()
        typer.echo(f"{count} expired session{'s' if count != 1 else ''} cleaned up")
    except SessionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        manager.close()
        coord.close()


if __name__ == "__main__":  # until budgetctl registers the group
    app()
