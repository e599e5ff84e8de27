"""Celery retries charged to the chain-wide retry budget."""

from __future__ import annotations

from coordinator.context.execution import ExecutionContext
from coordinator.models import Decision, WrapOptions


class _RetryCounted(Exception):
    """Stands for a Celery retry, so that the core counts it as a failed call."""


def _raise_retry() -> None:
    raise _RetryCounted("celery retry")


def count_retry(ctx: ExecutionContext, task_name: str) -> bool:
    """Count one retry at every level of ``ctx``'s path. False once the retry budget (or
    any other limit) stops the tree: the retried message will then not run its body."""
    decision = ctx.wrap_tool_call(_raise_retry,
                                  WrapOptions(operation_name=f"celery retry: {task_name}"))
    return decision == Decision.RETRY
