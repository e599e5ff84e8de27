"""Actual usage of a call: what the wrapped function reports with :func:`report_usage`,
or what its return value carries (OpenAI, Anthropic and LiteLLM response shapes)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .errors import InvalidCostError
from .limits import check_amount


@dataclass
class Usage:
    """Usage of one call. ``cost_usd`` None means "price it from the tokens"."""

    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    provider: str | None = None

    @property
    def has_tokens(self) -> bool:
        return bool(self.input_tokens or self.output_tokens)


class UsageCollector:
    """Accumulates the reports of one call (reports add up, e.g. per stream chunk)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.usage: Usage | None = None

    def add(self, report: Usage) -> None:
        with self._lock:
            if self.usage is None:
                self.usage = Usage(model=report.model, provider=report.provider)
            u = self.usage
            if report.cost_usd is not None:
                u.cost_usd = (u.cost_usd or 0.0) + report.cost_usd
            u.input_tokens += report.input_tokens
            u.output_tokens += report.output_tokens
            u.model = report.model or u.model
            u.provider = report.provider or u.provider


_collector: ContextVar[UsageCollector | None] = ContextVar("budget_usage", default=None)


def current_collector() -> UsageCollector | None:
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
) -> None:
    """Report the actual spend of the wrapped call that is running (reports add up).

    Raises :class:`~coordinator.errors.InvalidCostError` for a NaN, infinite or negative
    value, and ``RuntimeError`` outside a wrapped call. What is reported before the
    function raises is still charged.
    """
    check_amount("cost_usd", cost_usd)
    for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        check_amount(name, value)
        if value is not None and int(value) != value:
            raise InvalidCostError(name, value)
    collector = _collector.get()
    if collector is None:
        raise RuntimeError("report_usage() called outside a wrapped call")
    collector.add(Usage(cost_usd, int(input_tokens or 0), int(output_tokens or 0), model,
                        provider))


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and value >= 0 else 0


def usage_from_response(response: Any) -> Usage | None:
    """Token usage (and cost, where the response states it) carried by a provider response.

    Shapes: OpenAI Chat Completions (``prompt_tokens``/``completion_tokens``; cached
    tokens are already inside ``prompt_tokens``), OpenAI Responses and LiteLLM
    (``input_tokens``/``output_tokens``; LiteLLM's ``_hidden_params.response_cost``),
    Anthropic Messages (``input_tokens`` excludes cache reads and writes, which are added
    once). Returns None when the response carries no usage.
    """
    if response is None or isinstance(response, (str, bytes, int, float, bool)):
        return None
    cost = _get(response, "cost_usd")
    hidden = _get(response, "_hidden_params")
    if cost is None and hidden is not None:
        cost = _get(hidden, "response_cost")
    usage = _get(response, "usage")
    model = _get(response, "model")
    model = model if isinstance(model, str) else None
    if usage is None:
        if isinstance(cost, (int, float)):
            return Usage(cost_usd=float(cost), model=model)
        return None
    prompt = _get(usage, "prompt_tokens")
    if prompt is not None:  # OpenAI Chat Completions / LiteLLM
        inp, out = _int(prompt), _int(_get(usage, "completion_tokens"))
    else:
        inp, out = _int(_get(usage, "input_tokens")), _int(_get(usage, "output_tokens"))
        # Anthropic reports cache reads/writes beside input_tokens, not inside it.
        inp += _int(_get(usage, "cache_creation_input_tokens"))
        inp += _int(_get(usage, "cache_read_input_tokens"))
    if not inp and not out and not isinstance(cost, (int, float)):
        return None
    return Usage(
        cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
        input_tokens=inp, output_tokens=out, model=model,
    )
