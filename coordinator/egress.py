"""An example ``before_egress`` hook: refuse calls that would send data to a deny-listed
host. A tool that posts to a URL asks first with ``ExecutionContext.check_egress(url)``."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from .errors import InvalidConfigError
from .hooks import RecordingHook
from .models import Decision
from .pipeline import ShieldPipeline, ToolCallContext


class DenyListEgressHook(RecordingHook):
    """HALT for a URL whose host is a listed host or a subdomain of one (``example.com``
    also blocks ``api.example.com``), and for a URL without a host. Created with
    ``pipeline=``, it records a SafetyEvent ``egress_denied`` for each refusal."""

    def __init__(self, hosts: Iterable[str], *, pipeline: ShieldPipeline | None = None
                 ) -> None:
        listed = list(hosts) if not isinstance(hosts, str) else [hosts]
        bad = [h for h in listed if not isinstance(h, str) or not h.strip(". ")]
        if not listed or bad:
            raise InvalidConfigError("DenyListEgressHook", [{
                "loc": ("hosts",), "msg": "must be a non-empty list of host names",
                "input": bad or listed}])
        self.hosts = frozenset(h.strip(". ").lower() for h in listed)
        super().__init__(pipeline)

    def denied_host(self, url: str) -> str | None:
        """The listed host that ``url`` falls under, '' for a URL without a host, else
        None."""
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
        if not host:
            return ""
        parts = host.split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in self.hosts:
                return ".".join(parts[i:])
        return None

    def before_egress(self, ctx: ToolCallContext, url: str) -> Decision | None:
        """HALT when ``url``'s host is deny-listed (or missing)."""
        denied = self.denied_host(url)
        if denied is None:
            return None
        reason = (f"egress to {url!r} refused: host is under deny-listed {denied!r}"
                  if denied else f"egress to {url!r} refused: the URL has no host")
        self._emit(ctx, "egress_denied", Decision.HALT, reason, url=url, host=denied)
        return Decision.HALT
