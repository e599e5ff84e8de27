"""ContextDataMembers: the context-data members of the ExecutionContext facade (``data``,
merges, checkpoints, serialization, resume, parallel branches), each a delegation to
coordinator/data/ (the CCOS execution-context specification, docs/context-data.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..data import checkpoints
from ..data.context_data import ContextData
from ..data.lifecycle import parallel_children
from ..data.model import MergePolicy, MergeResult
from ..models import ExecutionConfig
from ..runtime.coordinator import Coordinator
from .state import ContextState

D = TypeVar("D", bound="ContextDataMembers")


class ContextDataMembers:
    """Mixed into ExecutionContext: what a context does with its data."""

    _state: ContextState
    if TYPE_CHECKING:  # provided by ExecutionContext
        spawn_child: Callable[..., Any]

        def __init__(self, config: ExecutionConfig, *,
                     coordinator: Coordinator | None = None) -> None: ...

        def close(self) -> None: ...

    @property
    def data(self) -> ContextData:
        """This context's data: reads follow its isolation level, writes are local."""
        state = self._state
        return ContextData(state.coord, state.path, lambda: state.closed)

    def merge_into_parent(self, policy: MergePolicy | str = MergePolicy.KEEP_EXISTING,
                          keys: list[str] | None = None) -> MergeResult:
        """Merge this context's data into its parent's (one atomic script)."""
        return self.data.merge_into_parent(policy, keys)

    def checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        """Record the data stack this context sees under ``checkpoint_id``."""
        return checkpoints.take_checkpoint(self._state.coord, self._state.path, checkpoint_id)

    def with_checkpointing(self: D, interval_ms: int, checkpoint_id: str | None = None) -> D:
        """Checkpoint every ``interval_ms`` (under ``<chain_id>:auto`` unless named)
        until closed. Returns this context."""
        name = checkpoint_id or f"{self._state.ctx_id}:auto"
        checkpoints.Checkpointer(self.data, name, interval_ms).start()
        return self

    def serialize(self) -> str:
        """The data stack this context sees, with each level's metadata, as JSON."""
        return checkpoints.serialize(self._state.coord, self._state.path)

    @classmethod
    def deserialize(cls: type[D], document: str | dict[str, Any], config: ExecutionConfig, *,
                    coordinator: Coordinator | None = None) -> D:
        """A new tree whose data is the serialized stack's (budgets start afresh)."""
        return checkpoints.restore(document, lambda: cls(config, coordinator=coordinator))

    @classmethod
    def resume(cls: type[D], checkpoint_id: str, config: ExecutionConfig, *,
               coordinator: Coordinator | None = None, root_id: str | None = None) -> D:
        """A new tree whose data is the checkpoint's (budgets start afresh)."""
        return checkpoints.resume(checkpoint_id, lambda c: cls(config, coordinator=c),
                                  coordinator=coordinator, root_id=root_id)

    def parallel(self: D, step_names: list[str], **limits: Any) -> list[D]:
        """One isolated child per step name, marked ``is_parallel``."""
        children: list[D] = parallel_children(self.spawn_child, step_names, **limits)
        return children
