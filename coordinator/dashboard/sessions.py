"""The active execution sessions of each served tenant (issue 17), as the JSON API and
the Sessions page show them."""

from __future__ import annotations

import threading
from typing import Any

from ..core.session_models import ExecutionSession
from ..store.session_reads import active_page
from ..store.sessions import SessionStore
from .service import MAX_PAGE, Service, UnknownTenantError


def session_json(s: ExecutionSession) -> dict[str, Any]:
    """One session row (times ISO 8601 UTC; budget_root links to the tree page)."""
    i = s.identity
    return {"tenant": i.tenant_id, "conversation": i.conversation_id, "path": i.path_id,
            "provider": s.provider, "sandbox_id": s.sandbox_id, "host": s.host,
            "status": s.status, "execution_count": s.execution_count,
            "total_execution_ms": s.total_execution_time_ms,
            "created_at": s.created_at.isoformat(), "last_used_at": s.last_used_at.isoformat(),
            "expires_at": s.expires_at.isoformat(), "budget_root": s.budget_root}


class SessionsView:
    """Pages of active sessions per dashboard tenant: a tenant's coordinator's
    SessionStore (its key prefix and tenant; the default tenant's store serves every
    session tenant, as SessionStore does)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._stores: dict[str, SessionStore] = {}
        self._lock = threading.Lock()

    def _store(self, tenant: str) -> SessionStore:
        if tenant not in self.service.coordinators:
            raise UnknownTenantError(tenant)
        with self._lock:  # made on first use: a coordinator may serve no sessions at all
            if tenant not in self._stores:
                self._stores[tenant] = SessionStore.for_coordinator(
                    self.service.coordinators[tenant])
            return self._stores[tenant]

    def page(self, tenant: str, *, page: int = 1, size: int = 50) -> dict[str, Any]:
        """One page of the tenant's active sessions. Raises ValueError for a bad page."""
        if not (1 <= size <= MAX_PAGE) or page < 1 or page > 1_000_000:
            raise ValueError(f"size must be 1..{MAX_PAGE} and page >= 1")
        store = self._store(tenant)

        def read() -> dict[str, Any]:
            p = active_page(store, (page - 1) * size, size)
            return {"tenant": tenant, "page": page, "size": size, "total": p.total,
                    "tenants_cut": p.tenants_cut, "now_ms": p.now_ms,
                    "sessions": [session_json(s) for s in p.sessions]}

        return self.service.cache.get(("sessions", tenant, page, size), read)
