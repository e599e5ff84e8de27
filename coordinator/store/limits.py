"""Changing a running context's limits (set_limits.lua): one atomic step on the tree's
slot that sets them, lifts the stop a raise ends, stops the context a lowering reaches,
records the limits_changed event and broadcasts the change."""

from __future__ import annotations

from ..core.contracts import SET_LIMITS
from ..core.paths import Path
from ..core.vocabulary import LimitsCode
from ..errors import ContextClosedError, ContextNotFoundError, CorruptStateError
from ..models_limits import LimitChange, LimitsChange, LimitsRequest
from .tree import Store
from .wire import Op


def set_limits(store: Store, path: Path, asked: LimitsRequest) -> LimitsChange:
    """Set the limits ``asked`` of the context at ``path``. Raises ContextNotFoundError,
    ContextClosedError (it or an ancestor is closed) or CorruptStateError (a number of
    its hash is not canonical); nothing is written then."""
    ks, root, ctx_id = store.ks, path.root, path.ctx_id
    reply = store.wire.run(Op(SET_LIMITS.script, SET_LIMITS.key_list(
        ctx=ks.ctx(root, ctx_id), events=ks.events(root, ctx_id),
        ancestors=[ks.ctx(root, a) for a in path.ids[:-1]]),
        SET_LIMITS.arg_list(ctx_id=ctx_id, root=root, abort_channel=ks.abort_channel,
                            actor=asked.actor, why=asked.reason,
                            limits=[x for pair in asked.dims() for x in pair])))
    code = LimitsCode(int(reply[0]))
    if code == LimitsCode.MISSING:
        raise ContextNotFoundError(ctx_id)
    if code == LimitsCode.CLOSED:
        raise ContextClosedError(ctx_id, str(reply[1]))
    if code == LimitsCode.CORRUPT:
        raise CorruptStateError(ctx_id, str(reply[1]), str(reply[2]))
    changes = tuple(LimitChange.of(str(reply[i]), int(reply[i + 1]) if reply[i + 1] else None,
                                   int(reply[i + 2])) for i in range(4, len(reply), 3))
    stop_reason = str(reply[2]) or None
    return LimitsChange(ctx_id=ctx_id, actor=asked.actor, reason=asked.reason,
                        changes=changes, lifted=(str(reply[3]),) if reply[3] else (),
                        stopped=stop_reason is not None, stop_reason=stop_reason)
