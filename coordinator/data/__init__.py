"""Shared context data for agent trees (the CCOS execution-context specification).

This package's root imports only pure modules; its Redis side is coordinator/store/data.py
and its keys coordinator/core/data_keys.py. The API lives in
:mod:`coordinator.data.context_data` and is reached through ``ExecutionContext.data``,
``spawn_child(isolation=...)``, ``merge_into_parent``, ``checkpoint``, ``parallel`` and
``ExecutionContext.resume``. The facade imports context_data, chain, checkpoints and
lifecycle, which import nothing of coordinator/context/; exposure.py (the running call)
and branches.py (ExecutionContexts on threads) import the context layer and are imported
only by the package root.
"""

from ..core.data_keys import DataKeys
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
