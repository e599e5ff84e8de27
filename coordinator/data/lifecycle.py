"""A child's data at its creation (isolation level, step, frozen view) and parallel
branches: isolated children marked ``is_parallel``, run, then merged into the parent."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ContextNotFoundError
from ..models import ChainMetadata
from ..store import Path
from . import chain
from .context_data import ContextData, redis_call
from .model import IsolationLevel, MergePolicy, MergeResult
from .store import DataStore
from .values import check_key

if TYPE_CHECKING:
    from ..context import ExecutionContext
    from ..coordinator import Coordinator

T = TypeVar("T")


def init_child(child: Any, coord: Coordinator, path: Path, isolation: IsolationLevel, *,
               step_name: str | None, is_parallel: bool, metadata: ChainMetadata) -> None:
    """Record a new child's isolation level and step (and freeze an isolated child's
    view of its ancestors) in one round trip, which also carries its StepStarted event.
    A plain inherit child without a step needs no record (no round trip): a context
    without one reads as ``inherit``."""
    if isolation is IsolationLevel.INHERIT and step_name is None and not is_parallel:
        return
    if step_name is not None:
        chain.step_started(child, coord, path, metadata, step_name,
                           isolation_level=isolation.value, is_parallel=is_parallel)
    try:
        redis_call("spawn (context data)", lambda: DataStore(coord.store).spawn(
            path, isolation.value, is_parallel=is_parallel, step_name=step_name or ""))
    except BaseException as exc:
        # Without its record the child would read as inherit: it is closed, never handed
        # out.
        chain.step_failed(child, exc)
        child.close()
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


def parallel(ctx: ExecutionContext, step_names: Sequence[str], **limits: Any
             ) -> list[ExecutionContext]:
    """One isolated child per name, marked ``is_parallel``: every branch sees the parent's
    data as it is now, and none sees another's writes (``step-parallel``)."""
    if isinstance(step_names, str):
        raise TypeError("step_names must be a sequence of names, not one string")
    for name in step_names:
        check_step_name(name)
    return [ctx.spawn_child(isolation=IsolationLevel.ISOLATED, step_name=name,
                            is_parallel=True, **limits) for name in step_names]


def run_parallel(ctx: ExecutionContext,
                 branches: Mapping[str, Callable[[ExecutionContext], T]],
                 policy: MergePolicy | str = MergePolicy.KEEP_EXISTING,
                 *, max_workers: int | None = None,
                 ) -> tuple[dict[str, T], dict[str, MergeResult]]:
    """Run each branch ``fn(child)`` in its own isolated parallel child, on threads, then
    merge every branch that returned into the parent with ``policy``, in the order the
    branches are given. Returns (results, merge results) by step name; if a branch
    raised, the others are still merged and the first error is raised after."""
    chosen = MergePolicy.of(policy)
    children = parallel(ctx, list(branches))

    def run(child: ExecutionContext, fn: Callable[[ExecutionContext], T]) -> T:
        with child:
            return fn(child)

    with ThreadPoolExecutor(max_workers=max_workers or len(children) or 1) as pool:
        futures = [pool.submit(run, child, fn)
                   for child, fn in zip(children, branches.values(), strict=True)]
    results: dict[str, T] = {}
    merges: dict[str, MergeResult] = {}
    first_error: BaseException | None = None
    for name, child, future in zip(branches, children, futures, strict=True):
        error = future.exception()
        if error is not None:
            first_error = first_error or error
            continue
        results[name] = future.result()
        merges[name] = child.data.merge_into_parent(chosen)
    if first_error is not None:
        raise first_error
    return results, merges


def merge_children(parent: ExecutionContext, child_ids: Sequence[str],
                   policy: MergePolicy | str = MergePolicy.KEEP_EXISTING
                   ) -> dict[str, MergeResult]:
    """Merge children of ``parent`` (by chain id, in the order given) into it with
    ``policy``: the chord callback of a Celery ``group`` of isolated ``@contained``
    tasks, which know only their ids. ContextNotFoundError, before any merge, for an id
    that is not a child of ``parent``."""
    chosen = MergePolicy.of(policy)
    if isinstance(child_ids, str):
        raise TypeError("child_ids must be a sequence of ids, not one string")
    data = parent.data
    ids = [check_key(cid, data.limits) for cid in child_ids]
    kids = set(redis_call("merge children", lambda: data.coordinator.store.children(
        data.path.root, data.path.ctx_id)))
    for cid in ids:
        if cid not in kids:
            raise ContextNotFoundError(cid)
    return {cid: ContextData(data.coordinator, data.path.child(cid)).merge_into_parent(chosen)
            for cid in ids}
