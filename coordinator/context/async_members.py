"""ContextAsyncMembers: the async twins of the ExecutionContext facade's members (close,
abort, spawn, attach, snapshot, wrap, evaluate), each running the blocking part off the
event loop or the call through the async driver (docs/async.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..models import ContextSnapshot, Decision, TokenBudget, WrapOptions
from ..runtime.coordinator import Coordinator
from .limits_members import ContextLimitsMembers
from .opening import check_type
from .wrap import run_async

MAX_REASON = 1000
"""The longest abort reason kept (the rest is cut)."""

if TYPE_CHECKING:
    from typing_extensions import Self


class ContextAsyncMembers(ContextLimitsMembers):
    """Mixed into ExecutionContext: its async twins."""

    if TYPE_CHECKING:  # provided by ExecutionContext
        spawn_child: Callable[..., Any]
        attach: Callable[..., Any]

        def close(self) -> None: ...

        def get_snapshot(self) -> ContextSnapshot: ...

    async def aclose(self) -> None:
        """Async twin of :meth:`close`: flushes and closes off the event loop."""
        await asyncio.to_thread(self.close)

    async def aabort(self, reason: str) -> None:
        """Async twin of :meth:`abort`: work here is cancelled at once; the durable abort
        is written off the event loop."""
        check_type("reason", reason, str)
        self._state.abort(reason[:MAX_REASON])
        await asyncio.to_thread(self._state.send_abort)

    async def aspawn_child(self, *args: Any, **kwargs: Any) -> Self:
        """Async twin of :meth:`spawn_child` (same arguments): opens off the event loop."""
        return await asyncio.to_thread(self.spawn_child, *args, **kwargs)

    @classmethod
    async def aattach(cls, token: str, coordinator: Coordinator | None = None
                      ) -> Self:
        """Async twin of :meth:`attach`: reads the context off the event loop."""
        return await asyncio.to_thread(cls.attach, token, coordinator)

    async def aget_snapshot(self) -> ContextSnapshot:
        """Async twin of :meth:`get_snapshot`: reads off the event loop."""
        return await asyncio.to_thread(self.get_snapshot)

    async def awrap_llm_call(self, fn: Callable[[], Awaitable[Any]],
                             options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_llm_call`: ``fn`` is a coroutine function, cancelled
        when the context is aborted or times out anywhere."""
        return (await run_async(self._state, self, "llm", fn, options)).decision

    async def awrap_tool_call(self, fn: Callable[[], Awaitable[Any]],
                              options: WrapOptions | None = None) -> Decision:
        """Async twin of :meth:`wrap_tool_call`."""
        return (await run_async(self._state, self, "tool", fn, options)).decision

    async def aevaluate(self, fn: Callable[[], Awaitable[Any]],
                        options: WrapOptions | None = None, *,
                        deadline: datetime | None = None,
                        token_budget: TokenBudget | None = None) -> Any:
        """Async twin of :meth:`evaluate`."""
        target = self
        if deadline is not None or token_budget is not None:
            target = await asyncio.to_thread(self._tightened, deadline, token_budget)
        try:
            outcome = await run_async(target._state, target, "llm", fn, options)
        finally:
            if target is not self:
                await target.aclose()
        if outcome.decision == Decision.ALLOW:
            return outcome.result
        return await asyncio.to_thread(target._result_or_raise, outcome)

