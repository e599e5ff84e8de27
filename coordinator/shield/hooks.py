"""Base of shield hooks that record their own SafetyEvents (a specific ``event_type`` such
as ``provider_rate_limit``) in the pipeline they joined, however they were attached."""

from __future__ import annotations

from typing import Any

from ..models import Decision, SafetyEvent
from .pipeline import ShieldPipeline, ToolCallContext


class RecordingHook:
    """A hook that records its own events (a specific ``event_type``) in the pipeline it
    joined: the one given as ``pipeline=`` (it adds itself), else the first it is added
    to (ExecutionContext mirrors them into the chain's event log)."""

    def __init__(self, pipeline: ShieldPipeline | None = None) -> None:
        self._pipeline: ShieldPipeline | None = None
        if pipeline is not None:
            pipeline.add_hook(self)

    def joined(self, pipeline: ShieldPipeline) -> None:
        """Called by ShieldPipeline.add_hook: record in ``pipeline`` from now on (in the
        first one only, when added to several)."""
        if self._pipeline is None:
            self._pipeline = pipeline

    @property
    def records_own_events(self) -> bool:
        """Read by ShieldPipeline: True when this hook records its decisions itself."""
        return self._pipeline is not None

    def _emit(self, ctx: ToolCallContext, event_type: str, decision: Decision, reason: str,
              **metadata: Any) -> None:
        if self._pipeline is None:
            return
        self._pipeline.record(SafetyEvent(
            event_type=event_type, decision=decision, reason=reason, hook=type(self).__name__,
            request_id=ctx.request_id,
            metadata={"chain_id": ctx.chain_id, "node_id": ctx.node_id, **metadata},
        ))
