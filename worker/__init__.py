"""The Celery integration's former import name, kept for existing code: everything here
is :mod:`coordinator.celery`'s (import it from there: a project's own ``worker.py``
shadows this package)."""

from coordinator.celery import *  # noqa: F403  (the same names, re-exported whole)
from coordinator.celery import __all__ as __all__
