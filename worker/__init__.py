"""The Celery integration's former import name, kept for existing code: everything here
is :mod:`coordinator.celery`'s (import it from there: a project's own ``worker.py``
shadows this package)."""

from coordinator.celery import (
    HEADER,
    NoContextHeaderError,
    TaskInterrupted,
    TaskStoppedError,
    contained,
    current_cancellation_token,
    current_context,
    incoming_token,
    install,
)

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
