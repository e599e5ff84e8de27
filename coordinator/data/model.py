"""The vocabulary of context data: isolation levels, merge policies and results, the
exposure policy and a context's step metadata (pure, no Redis)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .errors import IsolationLevelError, MergePolicyError


class IsolationLevel(str, Enum):
    """How much of its ancestors' data a child context sees."""

    INHERIT = "inherit"
    """A key missing here is looked up in the parent, then its parent... (live values)."""
    ISOLATED = "isolated"
    """Ancestors' values as they were when the child was created (a frozen view)."""
    SANDBOXED = "sandboxed"
    """No parent visibility at all."""

    @classmethod
    def of(cls, value: object) -> IsolationLevel:
        """The level named by ``value`` (an IsolationLevel or its string)."""
        try:
            return cls(value)
        except ValueError:
            raise IsolationLevelError("isolation", value,
                                      tuple(m.value for m in cls)) from None


class MergePolicy(str, Enum):
    """How a child's value meets its parent's in :func:`merge_into_parent`."""

    KEEP_EXISTING = "keep_existing"
    """The parent's value stays; keys the parent lacks are added (the default)."""
    OVERWRITE = "overwrite"
    """The child's value wins."""
    MERGE = "merge"
    """Deep merge: maps key by key, recursively; lists concatenated (parent's first);
    any other pair (scalars, a map against a list) takes the child's value."""

    @classmethod
    def of(cls, value: object) -> MergePolicy:
        """The policy named by ``value`` (a MergePolicy or its string)."""
        try:
            return cls(value)
        except ValueError:
            raise MergePolicyError("policy", value, tuple(m.value for m in cls)) from None


@dataclass(frozen=True)
class MergeResult:
    """What a merge changed in the parent."""

    added: tuple[str, ...] = ()
    """Keys the parent did not have."""
    overwritten: tuple[str, ...] = ()
    """Keys whose parent value was replaced by the child's."""
    merged: tuple[str, ...] = ()
    """Keys whose parent value was deep-merged with the child's."""
    sequence: int = 0
    """The parent's merge counter after this merge (merges into one parent are applied
    one at a time, in this order)."""

    @property
    def changed(self) -> tuple[str, ...]:
        """Every key whose parent value changed, sorted."""
        return tuple(sorted((*self.added, *self.overwritten, *self.merged)))


@dataclass(frozen=True)
class ExposurePolicy:
    """Which wrapped tools may read a read-only snapshot of the data
    (:func:`current_data_view`). Set on a context, inherited by its subtree (the nearest
    level that sets one wins). Off unless ``enabled`` and a rule matches the tool."""

    enabled: bool = False
    allow_ids: tuple[str, ...] = ()
    """Exact operation ids (``WrapOptions.operation_name``)."""
    allow_prefixes: tuple[str, ...] = ()
    """Operation id prefixes, e.g. ``ccos.ai.``."""
    allow_tags: tuple[str, ...] = ()
    """Tags a tool declares in ``WrapOptions.tags``, e.g. ``needs-context``."""

    def __post_init__(self) -> None:
        for name in ("allow_ids", "allow_prefixes", "allow_tags"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{name} must be a sequence of strings; got {value!r}")
            object.__setattr__(self, name, tuple(value))

    def allows(self, operation: str, tags: Iterable[str]) -> bool:
        """Whether a tool with this operation id and these tags may see the data."""
        if not self.enabled:
            return False
        return (operation in self.allow_ids
                or any(p and operation.startswith(p) for p in self.allow_prefixes)
                or bool(set(tags) & set(self.allow_tags)))

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "allow_ids": list(self.allow_ids),
                "allow_prefixes": list(self.allow_prefixes),
                "allow_tags": list(self.allow_tags)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExposurePolicy:
        return cls(enabled=bool(data.get("enabled")),
                   allow_ids=tuple(data.get("allow_ids", ())),
                   allow_prefixes=tuple(data.get("allow_prefixes", ())),
                   allow_tags=tuple(data.get("allow_tags", ())))


@dataclass(frozen=True)
class StepMetadata:
    """A context's metadata as the specification's ``ContextMetadata`` records it."""

    step_id: str
    """The context's id (chain id)."""
    created_at: float
    """Creation time, Unix seconds (Redis time)."""
    step_name: str | None = None
    checkpoint_id: str | None = None
    is_parallel: bool = False
    isolation_level: IsolationLevel = IsolationLevel.INHERIT
    tags: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step_id": self.step_id, "created_at": self.created_at,
                "step_name": self.step_name, "checkpoint_id": self.checkpoint_id,
                "is_parallel": self.is_parallel,
                "isolation_level": self.isolation_level.value, "tags": dict(self.tags)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepMetadata:
        return cls(step_id=str(data["step_id"]), created_at=float(data["created_at"]),
                   step_name=data.get("step_name"), checkpoint_id=data.get("checkpoint_id"),
                   is_parallel=bool(data.get("is_parallel")),
                   isolation_level=IsolationLevel.of(data.get("isolation_level", "inherit")),
                   tags={str(k): str(v) for k, v in dict(data.get("tags") or {}).items()})
