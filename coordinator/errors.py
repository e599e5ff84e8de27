"""Typed errors. Every error carries structured fields; its message states what was
wrong and the value observed."""

from __future__ import annotations

import dataclasses
from typing import Any

SHOWN_INPUT = 60
"""Characters of a refused value that an error message quotes (the rest is counted)."""


def shown(value: object) -> str:
    """``repr(value)``, cut to SHOWN_INPUT characters with the length of the rest."""
    text = repr(value)
    if len(text) <= SHOWN_INPUT:
        return text
    size = f"{len(value)} characters" if isinstance(value, str | bytes) else \
        f"{len(text)} characters of repr"
    return f"{text[:SHOWN_INPUT]}... ({size})"


class BudgetCoordinatorError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidCostError(BudgetCoordinatorError, ValueError):
    """A reported cost or token count is not a number, NaN, infinite, negative, fractional
    (tokens) or beyond any real amount."""

    def __init__(self, field: str, value: object, limit: float, *,
                 tokens: bool = False) -> None:
        self.field = field
        self.value = value
        self.limit = limit
        what = "a whole number of tokens" if tokens else "a USD amount"
        super().__init__(f"{field} must be {what} from 0 to {limit:g}; got {shown(value)}")


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


class ContextClosedError(BudgetCoordinatorError, ValueError):
    """The context, or an ancestor (``closed_by``), is closed: its limits cannot change.
    Nothing was changed."""

    def __init__(self, chain_id: str, closed_by: str) -> None:
        self.chain_id = chain_id
        self.closed_by = closed_by
        where = "" if closed_by == chain_id else f" (its ancestor {closed_by!r} is)"
        super().__init__(f"execution context {chain_id!r} is closed{where}")


class BackendUnavailableError(BudgetCoordinatorError, ConnectionError):
    """Redis could not be reached, or refused writes (full: ``maxmemory`` reached with
    ``noeviction``). Wraps fail closed: they return HALT with this reason."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        self.operation = operation
        self.cause = cause
        super().__init__(f"Redis unavailable during {operation}: {cause}")


class ContextDepthError(BudgetCoordinatorError, ValueError):
    """A child so deep in its tree that its context token would pass the token cap: no
    process could attach to it, so it is not opened (nothing is recorded)."""

    def __init__(self, depth: int, token_bytes: int, cap: int) -> None:
        self.depth = depth
        self.token_bytes = token_bytes
        self.cap = cap
        super().__init__(depth, token_bytes, cap)  # (args as given: it pickles)

    def __str__(self) -> str:
        return (f"a context at depth {self.depth} would need a {self.token_bytes}-byte "
                f"token, over the {self.cap}-byte cap")


class BackendConfigError(BudgetCoordinatorError, ValueError):
    """Redis answered, and the answer says the configuration is wrong (a wrong password,
    a database index out of range, an unknown Sentinel service, a server that is not
    Redis, TLS required or refused): retrying cannot help, so it is raised, never taken
    for a stall. ``url`` is shown with its password replaced by ``**``."""

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.problem = problem
        super().__init__(f"Redis at {url}: {problem}")


class TopologySettingError(BudgetCoordinatorError, ValueError):
    """A coordinator setting that cannot work (durability, replicas, WAIT timeout, lease,
    retention, timeouts): ``setting`` names it (or its environment variable), ``value``
    is what was given, the message says why."""

    def __init__(self, setting: str, value: object, why: str) -> None:
        self.setting, self.value = setting, value
        super().__init__(f"{setting}={value!r}: {why}")


class TopologyURLError(TopologySettingError):
    """A Redis URL this project cannot connect with: ``value`` is the URL with its
    passwords shown as ``**``, ``part`` the piece of it that is wrong."""

    def __init__(self, url: str, why: str, part: str | None = None) -> None:
        self.part = part
        where = f" ({part!r})" if part and part != url else ""
        super().__init__("url", url, why + where)


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


def _problem_text(problem: dict[str, Any]) -> str:
    """One pydantic problem as ``field: what is wrong (got value)``, without pydantic's
    ``Value error,`` prefix and without saying the field or the value twice
    (``max_steps must be ...``, not ``max_steps: max_steps must be ...``)."""
    loc = [str(p) for p in problem.get("loc", ())]
    where = ".".join(loc) or "<model>"
    if problem.get("type") == "missing":
        return f"{where}: required"
    message = str(problem.get("msg", "")).removeprefix("Value error, ")
    if loc and message.startswith(f"{loc[-1]} "):
        text = ".".join(loc[:-1] + [message])
    else:
        text = f"{where}: {message}"
    return text if "got " in message else f"{text} (got {shown(problem.get('input'))})"


class InvalidConfigError(PromptEvaluationError, ValueError):
    """A model (config, metadata, options, budget) was given invalid values.

    It is the Limits specification's ``PromptEvaluationError(phase="preflight")``.
    Nothing is written to Redis when this is raised.
    """

    def __init__(self, model: str, problems: list[dict[str, Any]]) -> None:
        self.model = model
        self.problems = problems
        details = "; ".join(_problem_text(e) for e in problems)
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
    tokens than input tokens). A wrapped call whose report raised it (or
    :class:`InvalidCostError`) is charged its estimate, at least the floor
    (docs/tokens.md)."""


class ReportOutsideCallError(BudgetCoordinatorError, RuntimeError):
    """``report_usage()`` was called where no wrapped call runs (a caller bug: the wrap
    that ran it, if any, raises it at once and spends no retry)."""

    def __init__(self) -> None:
        super().__init__("report_usage() called outside a wrapped call: call it from the "
                         "function given to wrap_llm_call/wrap_tool_call (same thread or "
                         "task)")


class NotAwaitableError(BudgetCoordinatorError, TypeError):
    """The function given to ``awrap_llm_call``/``awrap_tool_call`` returned something
    that cannot be awaited (a caller bug: raised at once, no retry spent)."""

    def __init__(self, fn: object, result: object) -> None:
        self.fn = fn
        super().__init__(f"awrap_* needs a function returning an awaitable; {fn!r} "
                         f"returned a {type(result).__name__} (use wrap_* for a plain "
                         f"function)")


class CorruptStateError(BudgetCoordinatorError, ValueError):
    """A number in Redis is not one the coordinator writes (a canonical decimal integer),
    found by a repair or a context-data write: fix or reset the field (docs/topology.md,
    "Repairing corrupt state"). Nothing was changed."""

    def __init__(self, chain_id: str, field: str, value: str) -> None:
        self.chain_id = chain_id
        self.field = field
        self.value = value
        super().__init__(f"context {chain_id!r}: {field} holds {value!r}, not a number as "
                         f"the coordinator writes one; fix or reset it (docs/topology.md)")


class QuotaRuleError(BudgetCoordinatorError, ValueError):
    """A quota rule (coordinator/quotas) is invalid: a NaN, negative or unrepresentable
    limit, an unknown period or time zone, an empty match, a bad name. Nothing is
    stored."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        got = "" if value is None else f"; got {shown(value)}"
        super().__init__(f"quota rule {field}: {problem}{got}")


class QuotaNotFoundError(BudgetCoordinatorError, LookupError):
    """No quota rule with this name exists."""

    def __init__(self, rule_id: str) -> None:
        self.rule_id = rule_id
        super().__init__(f"no quota rule {rule_id!r}")
