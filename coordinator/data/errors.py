"""Typed errors of context data. Each carries structured fields; its message states the
limit and the value observed. Nothing is written when one is raised."""

from __future__ import annotations

from ..errors import BudgetCoordinatorError


class ContextDataError(BudgetCoordinatorError):
    """Base class of the context-data errors."""


class DataKeyError(ContextDataError, ValueError):
    """A data key is not a string of 1 to ``limit`` characters (valid Unicode)."""

    def __init__(self, key: object, limit: int) -> None:
        self.key = key
        self.limit = limit
        shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:57] + "..."
        super().__init__(f"a data key must be a string of 1 to {limit} characters; "
                         f"got {shown}")


class DataValueError(ContextDataError, ValueError):
    """A value is not JSON: a set, a tuple, an object, NaN or an infinity, a map with a
    key that is not a string, lone surrogates, or nesting deeper than the limit."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"the value of {key!r} is not a JSON value: {reason}")


class DataTooLargeError(ContextDataError, ValueError):
    """A value's JSON, or a context's data as a whole, would exceed its limit."""

    def __init__(self, what: str, size: int, limit: int, key: str | None = None) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        self.key = key
        where = f" (key {key!r})" if key is not None else ""
        super().__init__(f"{what} would hold {size} bytes{where}; the limit is {limit}")


class DataClosedError(ContextDataError):
    """The context is closed: its data can be read and merged from, not written."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        super().__init__(f"context {chain_id!r} is closed; its data is read-only")


class DataOptionError(ContextDataError, ValueError):
    """An option that does not exist; ``allowed`` lists those that do."""

    def __init__(self, kind: str, value: object, allowed: tuple[str, ...]) -> None:
        self.kind = kind
        self.value = value
        self.allowed = allowed
        super().__init__(f"{kind} must be one of {', '.join(allowed)}; got {value!r}")


class MergePolicyError(DataOptionError):
    """A merge policy that does not exist."""


class IsolationLevelError(DataOptionError):
    """An isolation level that does not exist."""


class NoParentError(ContextDataError, LookupError):
    """A root context has no parent to merge into."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        super().__init__(f"context {chain_id!r} is a root: it has no parent to merge into")


class CheckpointNotFoundError(ContextDataError, LookupError):
    """No checkpoint with this id is known here (never taken, or expired)."""

    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        super().__init__(f"no checkpoint {checkpoint_id!r} in this Redis")


class InvalidCheckpointError(ContextDataError, ValueError):
    """A checkpoint id, or a serialized data stack, that cannot be used."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid checkpoint: {reason}")
