"""Typed errors. Every error carries structured fields; its message states what was
wrong and the value observed."""

from __future__ import annotations

import dataclasses
from typing import Any


class BudgetCoordinatorError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidCostError(BudgetCoordinatorError, ValueError):
    """A reported cost or token count is not a number, NaN, infinite, negative, fractional
    (tokens) or beyond any real amount."""

    def __init__(self, field: str, value: object) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field} must be a finite, non-negative number no larger than a "
                         f"real call's (tokens: whole numbers); got {value!r}")


class FrozenModelError(BudgetCoordinatorError, dataclasses.FrozenInstanceError):
    """A field of a frozen model (ExecutionConfig, ChainMetadata, SafetyEvent, ...) was
    assigned or deleted. It is the ``dataclasses.FrozenInstanceError`` (an
    ``AttributeError``) that the specifications' frozen dataclasses raise."""

    def __init__(self, model: str, field: str) -> None:
        self.model = model
        self.field = field
        super().__init__(f"cannot assign to field {field!r}: {model} is frozen")


class ContextNotFoundError(BudgetCoordinatorError, LookupError):
    """No context with this id exists (or its keys have expired)."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        super().__init__(f"no execution context {chain_id!r} in this Redis")


class ContextExistsError(BudgetCoordinatorError):
    """A context with this chain id already exists; chain ids are unique."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        super().__init__(f"an execution context {chain_id!r} already exists")


class BackendUnavailableError(BudgetCoordinatorError, ConnectionError):
    """Redis could not be reached, or refused writes (full: ``maxmemory`` reached with
    ``noeviction``). Wraps fail closed: they return HALT with this reason."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        self.operation = operation
        self.cause = cause
        super().__init__(f"Redis unavailable during {operation}: {cause}")


class TopologySettingError(BudgetCoordinatorError, ValueError):
    """A topology setting that cannot work (durability, replicas, WAIT timeout):
    ``setting`` names it, ``value`` is what was given, the message says why."""

    def __init__(self, setting: str, value: object, why: str) -> None:
        self.setting, self.value = setting, value
        super().__init__(f"{setting}={value!r}: {why}")


class TopologyURLError(TopologySettingError):
    """A Redis URL this project cannot connect with (``value`` is the URL part)."""

    def __init__(self, value: object, why: str) -> None:
        super().__init__("url", value, why)


class TokenError(BudgetCoordinatorError, ValueError):
    """A context token was rejected. Nothing was charged."""

    status_code = 401

    def __init__(self, reason: str) -> None:
        self.reason = reason
        # args holds the reason alone: an error rebuilt from its args (unpickled, or by a
        # Celery result backend) does not repeat the prefix.
        super().__init__(reason)

    def __str__(self) -> str:
        return f"context token rejected: {self.reason}"


class TokenMalformedError(TokenError):
    """The token is not base64url/msgpack of the expected shape (includes truncation)."""

    status_code = 400


class TokenTooLargeError(TokenError):
    """The token is longer than the hard cap."""

    status_code = 400

    def __init__(self, size: int, cap: int) -> None:
        self.size = size
        self.cap = cap
        super().__init__(f"{size} bytes exceeds the {cap}-byte cap")
        self.args = (size, cap)


class TokenVersionError(TokenError):
    """The token's format version is not one this library reads."""

    status_code = 400


class TokenSignatureError(TokenError):
    """The HMAC does not match: the token was tampered with or signed by another key."""


class UnknownKeyError(TokenError):
    """The token names a key id that is not configured here."""


class TokenExpiredError(TokenError):
    """The token's expiry time has passed."""


class TokenNotYetValidError(TokenError):
    """The token was issued further in the future than the allowed clock skew."""


class TokenMissingError(TokenError):
    """A service that requires a context token received a request without one."""


class TenantMismatchError(TokenError):
    """The token belongs to another tenant than this service accepts."""

    status_code = 403


class PromptEvaluationError(BudgetCoordinatorError, RuntimeError):
    """An evaluation stopped on a limit (the Limits specification's error).

    ``phase`` is ``preflight`` (invalid limits), ``deadline``, ``token_budget``, or
    ``halted`` for every other stop, whose reason is in ``reason``.
    ``provider_payload`` holds the deadline and the remaining allowances.
    """

    def __init__(
        self,
        message: str,
        *,
        phase: str,
        reason: str | None = None,
        provider_payload: dict[str, Any] | None = None,
    ) -> None:
        self.phase = phase
        self.reason = reason
        self.provider_payload = provider_payload or {}
        super().__init__(f"[{phase}] {message}")


class InvalidConfigError(PromptEvaluationError, ValueError):
    """A model (config, metadata, options, budget) was given invalid values.

    It is the Limits specification's ``PromptEvaluationError(phase="preflight")``.
    Nothing is written to Redis when this is raised.
    """

    def __init__(self, model: str, problems: list[dict[str, Any]]) -> None:
        self.model = model
        self.problems = problems
        details = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or '<model>'}: "
            + ("required" if e.get("type") == "missing" else
               f"{e.get('msg')} (got {e.get('input')!r})")
            for e in problems
        )
        super().__init__(f"invalid {model}: {details}", phase="preflight")
        # the message a person reads leaves out the specification's phase name (kept in
        # .phase): "invalid ExecutionConfig: max_steps: required"
        self.args = (f"invalid {model}: {details}",)


class DeadlineExceededError(RuntimeError):
    """Raised by tool code that cannot finish before the deadline."""


class TokenBudgetExceededError(RuntimeError):
    """Raised by tool code when the remaining token allowance is insufficient."""


class InvalidUsageError(BudgetCoordinatorError, ValueError):
    """Reported usage, a price, or a price table is inconsistent (e.g. more cached input
    tokens than input tokens). Nothing is recorded."""
