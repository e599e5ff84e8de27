"""Actual usage of a call: what the wrapped function reports with :func:`report_usage`,
or what its return value carries (OpenAI, Anthropic and LiteLLM response shapes)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidCostError, InvalidUsageError, ReportOutsideCallError
from ..models import MAX_COUNT, MAX_LABEL, check_slug, in_range
from .amounts import check_cost, check_tokens


@dataclass
class Usage:
    """Usage of one call. ``cost_usd`` None means "price it from the tokens".

    ``input_tokens`` counts every input token once; ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` say how many of them were read from or written to the
    provider's prompt cache (they are priced differently, but are not extra tokens).
    """

    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    provider: str | None = None
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def has_tokens(self) -> bool:
        """True when any input or output token was reported."""
        return bool(self.input_tokens or self.output_tokens)


def _add(total: Usage, report: Usage) -> None:
    if report.cost_usd is not None:
        total.cost_usd = (total.cost_usd or 0.0) + report.cost_usd
    total.input_tokens += report.input_tokens
    total.output_tokens += report.output_tokens
    total.cache_read_input_tokens += report.cache_read_input_tokens
    total.cache_creation_input_tokens += report.cache_creation_input_tokens
    total.model = report.model or total.model
    total.provider = report.provider or total.provider


class UsageMeter:
    """One live contribution to a call's usage (a stream) that is replaced, not added to,
    as it is refined: an estimate from the chunks seen so far, then the provider's count."""

    def __init__(self, collector: UsageCollector) -> None:
        self._collector = collector

    def set(self, usage: Usage) -> None:
        """Replace this meter's contribution with ``usage`` (which it keeps: pass a
        fresh object each time)."""
        with self._collector._lock:
            self._collector._meters[self] = usage


class UsageCollector:
    """Accumulates the reports of one call (reports add up, e.g. per stream chunk)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reported: Usage | None = None
        self._meters: dict[UsageMeter, Usage] = {}
        self.invalid: str | None = None
        """Why a report was refused (the call is then charged by the invalid rule)."""

    def add(self, report: Usage) -> None:
        """Add one report to the call's usage."""
        with self._lock:
            if self._reported is None:
                self._reported = Usage(model=report.model, provider=report.provider)
            _add(self._reported, report)

    def meter(self) -> UsageMeter:
        """A contribution that its owner keeps replacing (see :class:`UsageMeter`)."""
        return UsageMeter(self)

    @property
    def usage(self) -> Usage | None:
        """What the call used so far (reports plus meters), or None if nothing came."""
        with self._lock:
            parts = ([self._reported] if self._reported is not None else []) + list(
                self._meters.values())
        if not parts:
            return None
        total = Usage(model=parts[0].model, provider=parts[0].provider)
        for part in parts:
            _add(total, part)
        return total


_collector: ContextVar[UsageCollector | None] = ContextVar("budget_usage", default=None)


def current_collector() -> UsageCollector | None:
    """The collector of the wrapped call running here, if any."""
    return _collector.get()


def set_collector(collector: UsageCollector | None) -> Any:
    return _collector.set(collector)


def reset_collector(token: Any) -> None:
    _collector.reset(token)


def report_usage(
    cost_usd: float | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    model: str | None = None,
    provider: str | None = None,
    *,
    cache_read_input_tokens: int | None = None,
    cache_creation_input_tokens: int | None = None,
) -> None:
    """Report the actual spend of the wrapped call that is running (reports add up).

    ``input_tokens`` counts every input token once; the cache fields say how many of them
    were cache reads and writes (priced at the model's cache rates).

    Raises :class:`~coordinator.errors.InvalidCostError` for a value that is not a number,
    NaN, infinite, fractional (tokens), negative or beyond any real call's,
    :class:`~coordinator.errors.InvalidUsageError` when the cache fields exceed
    ``input_tokens`` or ``provider``/``model`` are not names (the call is then charged its
    estimate, at least the floor, even if the function catches the error), and
    :class:`~coordinator.errors.ReportOutsideCallError` outside a wrapped call. What is
    reported before the function raises is still charged.
    """
    collector = _collector.get()
    try:
        check_cost(cost_usd)
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                            ("cache_read_input_tokens", cache_read_input_tokens),
                            ("cache_creation_input_tokens", cache_creation_input_tokens)):
            check_tokens(name, value)
        check_names(provider, model)
        inp = int(input_tokens or 0)
        cread = int(cache_read_input_tokens or 0)
        cwrite = int(cache_creation_input_tokens or 0)
        if cread + cwrite > inp:
            raise InvalidUsageError(
                f"cache_read_input_tokens ({cread}) + cache_creation_input_tokens ({cwrite}) "
                f"exceed input_tokens ({inp}): input_tokens must include them")
    except (InvalidCostError, InvalidUsageError) as exc:
        if collector is not None:  # the call is charged its estimate, even if this is caught
            collector.invalid = f"{type(exc).__name__}: {exc}"
        raise
    if collector is None:
        raise ReportOutsideCallError()
    collector.add(Usage(cost_usd, inp, int(output_tokens or 0), model, provider, cread, cwrite))


def is_model_name(model: Any) -> bool:
    """A string of 1 to MAX_LABEL characters (the bound of every label)."""
    return isinstance(model, str) and 0 < len(model) <= MAX_LABEL


def check_names(provider: Any, model: Any) -> None:
    """Raise InvalidUsageError unless ``provider`` is a provider slug (or None) and
    ``model`` a model name (:func:`is_model_name`, or None)."""
    if provider is not None:
        try:
            check_slug(provider)
        except ValueError as exc:
            raise InvalidUsageError(str(exc)) from None
    if model is not None and not is_model_name(model):
        raise InvalidUsageError(f"model must be a name of 1-{MAX_LABEL} characters; "
                                f"got {model!r}")


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` for a mapping, ``obj.name`` for an SDK object (None if absent)."""
    if type(obj) is dict:  # the common case, without the slower ABC check (per chunk)
        return obj.get(name)
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def count(value: Any) -> int | None:
    """A token count from a provider payload, None when absent. Raises InvalidUsageError
    for anything else than a whole number from 0 to MAX_COUNT: a payload that states
    impossible counts cannot be charged from (the wrap charges the call's estimate)."""
    if value is None:
        return None
    if not (in_range(value, 0, MAX_COUNT) and int(value) == value):
        raise InvalidUsageError(f"a provider's token count must be a whole number from 0 "
                                f"to {MAX_COUNT}; got {value!r}")
    return int(value)


def _n(value: Any) -> int:
    return count(value) or 0


def tokens_from_usage(usage: Any) -> Usage:
    """The tokens of one provider ``usage`` object, each input token counted once.

    - OpenAI Chat Completions and LiteLLM: ``prompt_tokens`` already includes the cache
      reads and writes (``prompt_tokens_details.cached_tokens``/``cache_write_tokens``,
      LiteLLM's ``cache_read_input_tokens``/``cache_creation_input_tokens``).
    - OpenAI Responses: ``input_tokens`` includes ``input_tokens_details.cached_tokens``
      and ``cache_write_tokens``.
    - Anthropic Messages: ``input_tokens`` excludes the cache reads and writes, which are
      reported beside it and added here once.
    """
    prompt = count(field(usage, "prompt_tokens"))
    if prompt is not None:
        inp, out = prompt, _n(field(usage, "completion_tokens"))
        details = field(usage, "prompt_tokens_details")
        cread = count(field(details, "cached_tokens")) if details is not None else None
        cwrite = None
        if details is not None:  # OpenAI says cache_write_tokens, LiteLLM cache_creation_tokens
            cwrite = count(field(details, "cache_write_tokens"))
            if cwrite is None:
                cwrite = count(field(details, "cache_creation_tokens"))
        if cread is None:
            cread = _n(field(usage, "cache_read_input_tokens"))
        if cwrite is None:
            cwrite = _n(field(usage, "cache_creation_input_tokens"))
    else:
        inp, out = _n(field(usage, "input_tokens")), _n(field(usage, "output_tokens"))
        details = field(usage, "input_tokens_details")
        if details is not None:  # OpenAI Responses
            cread = _n(field(details, "cached_tokens"))
            cwrite = _n(field(details, "cache_write_tokens"))
        else:  # Anthropic Messages: cache tokens are beside input_tokens, not inside
            cread = _n(field(usage, "cache_read_input_tokens"))
            cwrite = _n(field(usage, "cache_creation_input_tokens"))
            inp += cread + cwrite
    # A provider's inconsistent breakdown must not make the charge fail at settle time.
    cread = min(cread, inp)
    cwrite = min(cwrite, inp - cread)
    return Usage(input_tokens=inp, output_tokens=out, cache_read_input_tokens=cread,
                 cache_creation_input_tokens=cwrite)


def usage_from_response(response: Any) -> Usage | None:
    """Token usage (and cost, where the response states it) carried by a provider response
    (see :func:`tokens_from_usage` for the shapes). LiteLLM's
    ``_hidden_params["response_cost"]`` is taken as the cost. Returns None when the
    response carries no usage; raises InvalidUsageError when it states impossible counts
    or an impossible cost."""
    if response is None or isinstance(response, (str, bytes, int, float, bool)):
        return None
    cost = field(response, "cost_usd")
    hidden = field(response, "_hidden_params")
    if cost is None and hidden is not None:
        cost = field(hidden, "response_cost")
    if cost is not None:
        try:
            check_cost(cost)
        except ValueError as exc:
            raise InvalidUsageError(f"the response's cost: {exc}") from None
        cost = float(cost)
    usage = field(response, "usage")
    model = field(response, "model")
    model = model if is_model_name(model) else None
    if usage is None:
        return Usage(cost_usd=cost, model=model) if cost is not None else None
    result = tokens_from_usage(usage)
    if not result.has_tokens and cost is None:
        return None
    result.cost_usd = cost
    result.model = model
    return result
