"""An example ``before_egress`` hook: refuse calls that would send data to a deny-listed
host. A tool that posts to a URL asks first with ``ExecutionContext.check_egress(url)``."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidConfigError
from ..models import Decision
from .hooks import RecordingHook
from .pipeline import ShieldPipeline, ToolCallContext

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


# IPv4 as resolvers also read it: 1 to 4 parts, each decimal, octal (0177) or hex (0x7f)
_NUMERIC_V4 = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}")


def _ip(host: str) -> str | None:
    """``host``'s IP address in canonical form, or None when it is not an IP address.
    Every spelling of one address is the same address: ``127.1``, ``2130706433``,
    ``0x7f.0.0.1`` and ``::ffff:127.0.0.1`` are all ``127.0.0.1`` (a deny list would
    otherwise be passed by writing a listed address another way)."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        if not _NUMERIC_V4.fullmatch(host):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).compressed


def _as_listed(entry: object) -> str:
    """A deny-list entry as it is matched: lower case, an IP address in canonical form.
    ValueError saying what is wrong when it is not a bare host name or IP address."""
    host = entry.strip(". ").lower() if isinstance(entry, str) else ""
    ip = _ip(host)
    if ip or (len(host) <= 253 and _HOST_NAME.fullmatch(host)):
        return ip or host
    if isinstance(entry, str) and entry.startswith("*."):
        raise ValueError(f"list {entry.lstrip('*.')!r} instead: a listed host also blocks "
                         f"its subdomains")
    raise ValueError("must be a bare host name or IP address such as 'example.com', "
                     "'10.0.0.1' or '::1' (no scheme, port, path or wildcard)")


def _host(url: str) -> str | None:
    """``url``'s host, normalized as listed hosts are ('' when it has none), or None when
    the URL is malformed (such as an unclosed IPv6 bracket or a port out of 0-65535)."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}: {url!r}")
    try:
        parts = urlsplit(url)
        _ = parts.port  # parsed on access: ValueError when malformed
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".").lower()
    return _ip(host) or host


class DenyListEgressHook(RecordingHook):
    """HALT for a URL whose host is a listed host or a subdomain of one (``example.com``
    also blocks ``api.example.com``), for a URL without a host and for a malformed URL.
    ``hosts``: bare host names or IP addresses. Created with ``pipeline=``, it records a
    SafetyEvent ``egress_denied`` for each refusal."""

    def __init__(self, hosts: Iterable[str], *, pipeline: ShieldPipeline | None = None
                 ) -> None:
        listed: list[object] = ([hosts] if isinstance(hosts, str)
                                else list(hosts) if isinstance(hosts, Iterable) else [])
        problems: list[dict[str, Any]] = []
        normal = []
        for i, entry in enumerate(listed):
            try:
                normal.append(_as_listed(entry))
            except ValueError as exc:
                problems.append({"loc": ("hosts", i), "msg": str(exc), "input": entry})
        if not listed:
            problems.append({"loc": ("hosts",), "input": hosts,
                             "msg": "must be a host name or a non-empty list of them"})
        if pipeline is not None and not isinstance(pipeline, ShieldPipeline):
            problems.append({"loc": ("pipeline",), "msg": "must be a ShieldPipeline or None",
                             "input": pipeline})
        if problems:
            raise InvalidConfigError("DenyListEgressHook", problems)
        self.hosts = frozenset(normal)
        super().__init__(pipeline)

    def _listed_above(self, host: str) -> str | None:
        """The listed host that ``host`` is, or is a subdomain of; else None."""
        parts = host.split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in self.hosts:
                return ".".join(parts[i:])
        return None

    def denied_host(self, url: str) -> str | None:
        """The listed host that ``url`` falls under, '' for a URL without a host or a
        malformed one, else None. TypeError when ``url`` is not a str."""
        host = _host(url)
        return self._listed_above(host) if host else ""

    def before_egress(self, ctx: ToolCallContext, url: str) -> Decision | None:
        """HALT when ``url``'s host is deny-listed or missing, or ``url`` is malformed."""
        host = _host(url)
        denied = self._listed_above(host) if host else ""
        if denied is None:
            return None
        why = (f"host is under deny-listed {denied!r}" if denied
               else "the URL has no host" if host == "" else "the URL is malformed")
        self._emit(ctx, "egress_denied", Decision.HALT, f"egress to {url!r} refused: {why}",
                   url=url, host=denied)
        return Decision.HALT
