"""A child's data at its creation (isolation level, step, frozen view) and parallel
branches: isolated children marked ``is_parallel`` (run and merged by branches.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.paths import Path
from ..models import ChainMetadata
from ..store.data import DataRefused, DataStore
from . import chain
from .context_data import data_limits, redis_call, refusal
from .model import IsolationLevel

if TYPE_CHECKING:
    from ..runtime.coordinator import Coordinator

C = TypeVar("C")


def init_child(key: Any, coord: Coordinator, path: Path, isolation: IsolationLevel, *,
               step_name: str | None, is_parallel: bool, metadata: ChainMetadata,
               close: Callable[[], None]) -> None:
    """Record a new child's isolation level and step (and freeze an isolated child's
    view of its ancestors) in one round trip, which also carries its StepStarted event
    (``key``: the handle's state, which its close and exit report on). A plain inherit
    child without a step needs no record (no round trip): a context without one reads
    as ``inherit``. On failure the child is closed (``close``), never handed out."""
    if isolation is IsolationLevel.INHERIT and step_name is None and not is_parallel:
        return
    if step_name is not None:
        chain.step_started(key, coord, path, metadata, step_name,
                           isolation_level=isolation.value, is_parallel=is_parallel)
    try:
        reply = redis_call("spawn (context data)", lambda: DataStore(coord.store).spawn(
            path, isolation.value, is_parallel=is_parallel, step_name=step_name or ""))
        if isinstance(reply, DataRefused):
            raise refusal(path.ctx_id, reply, data_limits(coord))
    except BaseException as exc:
        # Without its record the child would read as inherit.
        chain.step_failed(key, exc)
        close()
        raise


def check_step_name(step_name: object) -> str | None:
    """``step_name`` if it is None or a usable name (1-256 characters), else TypeError
    or ValueError (before anything is written)."""
    if step_name is None:
        return None
    if not isinstance(step_name, str):
        raise TypeError(f"step_name must be a string; got {step_name!r}")
    if not 1 <= len(step_name) <= 256:
        raise ValueError(f"step_name must be 1 to 256 characters; got {len(step_name)}")
    return step_name


def parallel_children(spawn_child: Callable[..., C], step_names: Sequence[str], **limits: Any
             ) -> list[C]:
    """One isolated child per name (``spawn_child``: the parent's), marked
    ``is_parallel``: every branch sees the parent's data as it is now, and none sees
    another's writes (``step-parallel``)."""
    if isinstance(step_names, str):
        raise TypeError("step_names must be a sequence of names, not one string")
    for name in step_names:
        check_step_name(name)
    return [spawn_child(isolation=IsolationLevel.ISOLATED, step_name=name,
                        is_parallel=True, **limits) for name in step_names]
