"""Errors of the Celery integration (subclasses of the package's common base)."""

from __future__ import annotations

from coordinator.context.cancellation import CancelledByContext
from coordinator.core.vocabulary import StopReason
from coordinator.errors import BudgetCoordinatorError


class TaskStoppedError(BudgetCoordinatorError):
    """A contained task did not run, or was cut short, because its context (or an
    ancestor) is stopped: aborted, out of budget, past its deadline, or closed.

    It is the task's final state (``FAILURE``); ``reason`` is the stop reason
    (``aborted``, ``timeout``, ``budget_exceeded``, ``closed``, ...)."""

    def __init__(self, task_name: str, task_id: str, reason: str, detail: str = "") -> None:
        self.task_name = task_name
        self.task_id = task_id
        self.reason = reason
        self.detail = detail
        # args mirror the constructor, so that Celery can rebuild the error on the client
        super().__init__(task_name, task_id, reason, detail)

    def __str__(self) -> str:
        extra = f" ({self.detail})" if self.detail and self.detail != self.reason else ""
        return f"task {self.task_name}[{self.task_id}] stopped: {self.reason}{extra}"


class TaskInterrupted(CancelledByContext):
    """Raised inside a running task body when its context is aborted or times out in any
    process. Being a :class:`~coordinator.cancellation.CancelledByContext`, a wrapped call
    it interrupts is settled as aborted by the core."""

    def __init__(self, reason: str = StopReason.ABORTED) -> None:
        # a default reason: the threads pool raises it by type, without arguments
        super().__init__(reason)


class NoContextHeaderError(BudgetCoordinatorError):
    """A contained task's message carried no ``budget_context`` header (it was sent with
    no context current, or by a process that never called ``install``), and its
    ``@contained`` lacks the limits a root of its own needs. The body never ran."""

    def __init__(self, task_name: str, task_id: str, missing: tuple[str, ...]) -> None:
        self.task_name = task_name
        self.task_id = task_id
        self.missing = tuple(missing)  # a list once rebuilt from a result backend
        super().__init__(task_name, task_id, self.missing)

    def __str__(self) -> str:
        return (f"task {self.task_name}[{self.task_id}] received no budget_context header, "
                f"so it has no context to join: send it from inside one "
                f"(`with ExecutionContext(...):` around `.delay()`, with install(app) called "
                f"in the sending process), or give @contained {' and '.join(self.missing)} "
                f"so that it opens a root of its own")
