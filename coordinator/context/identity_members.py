"""ContextIdentityMembers: the ExecutionContext facade's ids and settings (context id, root,
path, effective limits, metadata, pipeline, circuit breaker, cancellation token, the
signed token, replayable call keys, stop reason, deadline), each read from its state."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from ..core.amounts import ms_to_datetime
from ..core.paths import Path
from ..models import ChainMetadata, ExecutionConfig
from ..shield.pipeline import ShieldPipeline
from .cancellation import CancellationToken
from .opening import mint_token
from .state import ContextState


class ContextIdentityMembers:
    """Mixed into ExecutionContext: who it is and how it is set."""

    _state: ContextState


    @property
    def chain_id(self) -> str:
        return self._state.ctx_id

    @property
    def root_id(self) -> str:
        return self._state.path.root

    @property
    def path(self) -> tuple[str, ...]:
        """Context ids from the root down to this one."""
        return self._state.path.ids

    @property
    def _path(self) -> Path:
        return self._state.path

    @property
    def config(self) -> ExecutionConfig:
        """The effective limits (as the open reported them)."""
        return self._state.config

    @property
    def metadata(self) -> ChainMetadata:
        return self._state.metadata

    @property
    def pipeline(self) -> ShieldPipeline | None:
        return self._state.pipeline

    @pipeline.setter
    def pipeline(self, pipeline: ShieldPipeline | None) -> None:
        self._state.pipeline = pipeline

    @property
    def circuit_breaker(self) -> Any | None:
        return self._state.circuit_breaker

    @circuit_breaker.setter
    def circuit_breaker(self, breaker: Any | None) -> None:
        self._state.circuit_breaker = breaker

    @property
    def cancellation_token(self) -> CancellationToken:
        """Set when this context (or one above it) is aborted or times out."""
        return self._state.cancellation_token

    @property
    def token(self) -> str:
        """A signed string naming this context, for another process to :meth:`attach`.
        It expires at the context's deadline, or after a day."""
        return mint_token(self._state)

    def enable_call_keys(self) -> None:
        """Give this handle's calls replayable ids, ``<chain_id>:<n>`` with n counting from
        0. Work replayed in a new handle of the same context (a task redelivered after its
        worker died) is then recognised call by call: a call that already finished is not
        run or charged again (``wrap_*`` returns ALLOW, RETRY or HALT as it ended, HALT
        for one that raised, and ``evaluate`` returns None), and a call that was in
        flight is settled once.
        The replayed work must make its calls in the same order."""
        self._state.call_seq = itertools.count()

    @property
    def stop_reason(self) -> str | None:
        """Why this context (or one above it) is stopped, as far as this process knows
        (set at open, by a halted call, or by a broadcast stop); None while running."""
        return self._state.stopped

    @property
    def deadline(self) -> datetime | None:
        """The effective deadline (the earliest of this context's and its ancestors')."""
        return ms_to_datetime(self._state.deadline_ms)
