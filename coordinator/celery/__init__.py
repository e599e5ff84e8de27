"""Celery integration: the ``@contained`` task decorator, propagation of the context
token in the ``budget_context`` message header, and the interrupt that stops running
tasks when their context is aborted from any process (docs/celery.md)."""

from coordinator.context.execution import current_cancellation_token, current_context

from .decorator import contained
from .errors import NoContextHeaderError, TaskInterrupted, TaskStoppedError
from .propagation import HEADER, incoming_token, install

__all__ = [
    "HEADER",
    "NoContextHeaderError",
    "TaskInterrupted",
    "TaskStoppedError",
    "contained",
    "current_cancellation_token",
    "current_context",
    "incoming_token",
    "install",
]
