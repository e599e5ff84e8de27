"""The sandbox provider protocol: create, connect by id, run code with a timeout,
interrupt, kill; and the output buffer every provider cuts at the size limit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...core.session_models import Language


@dataclass
class RunOutput:
    """What one run produced, before sanitization."""

    output: str = ""
    """stdout, stderr and the text of rich results, in order."""
    error: str | None = None
    """The exception (``Name: value`` and its traceback) when the code raised."""
    timed_out: bool = False
    """The run hit its timeout and was interrupted."""
    interrupted: bool = False
    """An interrupt from outside (an abort) ended the run."""
    truncated: bool = False
    """Output was cut at the size limit."""
    json_result: bool = False
    """The main result was JSON data."""


@dataclass
class OutputBuffer:
    """Collects output up to ``limit`` characters; what is beyond is dropped and noted."""

    limit: int
    parts: list[str] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def add(self, text: str) -> None:
        room = self.limit - self.size
        if len(text) > room:
            text = text[:max(0, room)]
            self.truncated = True
        if text:
            self.parts.append(text)
            self.size += len(text)

    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True)
class SandboxInfo:
    """Where a sandbox is: its id, the host running it ('' = reachable from anywhere) and
    connection details (never a secret: they are stored in the session record)."""

    sandbox_id: str
    host: str
    connection: Mapping[str, str]


class Sandbox(Protocol):
    """A connected sandbox. ``run`` calls are serialized; ``interrupt`` may come from any
    thread while a run is in progress."""

    @property
    def info(self) -> SandboxInfo: ...

    def run(self, code: str, language: Language, *, timeout_s: float,
            max_output_chars: int) -> RunOutput:
        """Run ``code``; on timeout interrupt it and return ``timed_out``. Raises
        :class:`~coordinator.sessions.SandboxLostError` when the sandbox dies."""
        ...

    def interrupt(self) -> None:
        """Interrupt the run in progress (nothing else is stopped)."""
        ...


class SandboxProvider(Protocol):
    """Makes and finds sandboxes of one kind."""

    name: str
    languages: tuple[Language, ...]
    """Languages its sandboxes run."""

    def create(self, labels: Mapping[str, str], *, timeout_s: float, ttl_s: float,
               template: str) -> Sandbox:
        """A new sandbox, ready to run code, within ``timeout_s``; ``labels`` (tenant,
        conversation, path) go into its environment and metadata."""
        ...

    def connect(self, info: SandboxInfo) -> Sandbox:
        """The sandbox a record names. Raises SandboxElsewhereError when it lives on
        another host, SandboxLostError when it is gone."""
        ...

    def kill(self, info: SandboxInfo) -> bool:
        """Kill the sandbox; False when it was already gone. Raises
        SandboxElsewhereError when it lives on another host."""
        ...
