"""Parallel branches run on threads and merged into their parent, and the merge of a
Celery group's isolated children by their ids (this module sits below the facade: it
takes ExecutionContexts, and the facade does not import it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..context.execution import ExecutionContext
from ..errors import ContextNotFoundError
from .context_data import ContextData, redis_call
from .model import MergePolicy, MergeResult
from .values import check_key

T = TypeVar("T")


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
    children = ctx.parallel(list(branches))

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
