"""A handle's egress check: the pipeline's ``before_egress`` hooks asked whether data may
be sent to a URL, with the running call's tool context (or one made for the handle)."""

from __future__ import annotations

import uuid

from ..models import Decision
from ..shield.pipeline import ToolCallContext
from .call import active_call
from .opening import check_type
from .state import ContextState


def check_egress(state: ContextState, owner: object, url: str) -> Decision:
    """ALLOW without a pipeline; else the hooks' decision for ``url``, the context of the
    call ``owner`` (a handle of ``state``) runs here, if any, and a refusal's event
    mirrored into the chain's event log. TypeError when ``url`` is not a string."""
    check_type("url", url, str)
    pipeline = state.pipeline
    if pipeline is None:
        return Decision.ALLOW
    call = active_call.get()
    tool_ctx = call.tool_ctx if call is not None and call.owner is owner else None
    if tool_ctx is None:
        m = state.metadata
        tool_ctx = ToolCallContext(
            request_id=m.request_id, chain_id=state.ctx_id, node_id=uuid.uuid4().hex,
            kind="tool", model=m.model, org_id=m.org_id, team=m.team, service=m.service,
            user_id=m.user_id, tags=dict(m.tags))
    decision = pipeline.before_egress(tool_ctx, url)
    state.mirror_pipeline_events(pipeline)
    return decision
