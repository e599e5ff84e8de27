"""Shared context data for agent trees (the CCOS execution-context specification).

This package's root imports only pure modules (the Redis store imports its key helper);
the API lives in :mod:`coordinator.data.context_data` and is reached through
``ExecutionContext.data``, ``spawn_child(isolation=...)``, ``merge_into_parent``,
``checkpoint``, ``parallel`` and ``ExecutionContext.resume``.
"""

from .errors import (
    CheckpointNotFoundError,
    ContextDataError,
    DataClosedError,
    DataKeyError,
    DataOptionError,
    DataTooLargeError,
    DataValueError,
    InvalidCheckpointError,
    IsolationLevelError,
    MergePolicyError,
    NoParentError,
)
from .keys import DataKeys
from .model import ExposurePolicy, IsolationLevel, MergePolicy, MergeResult, StepMetadata
from .values import DataLimits

__all__ = [
    "CheckpointNotFoundError",
    "ContextDataError",
    "DataClosedError",
    "DataKeyError",
    "DataKeys",
    "DataLimits",
    "DataOptionError",
    "DataTooLargeError",
    "DataValueError",
    "ExposurePolicy",
    "InvalidCheckpointError",
    "IsolationLevel",
    "IsolationLevelError",
    "MergePolicy",
    "MergePolicyError",
    "MergeResult",
    "NoParentError",
    "StepMetadata",
]
