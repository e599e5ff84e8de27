"""USD prices of token usage: user overrides first, then the maintained price table."""

from __future__ import annotations

import threading

_overrides: dict[str, tuple[float, float]] = {}
_lock = threading.Lock()


def set_price(model: str, *, input_per_mtok: float, output_per_mtok: float) -> None:
    """Override the price of ``model`` in USD per million input and output tokens."""
    for name, value in (("input_per_mtok", input_per_mtok), ("output_per_mtok", output_per_mtok)):
        if not (value >= 0 and value != float("inf")):
            raise ValueError(f"{name} must be a finite, non-negative price; got {value!r}")
    with _lock:
        _overrides[model] = (input_per_mtok, output_per_mtok)


def clear_prices() -> None:
    """Remove every override."""
    with _lock:
        _overrides.clear()


def price_usd(model: str | None, input_tokens: int, output_tokens: int) -> float | None:
    """The USD cost of a call, or None when the model's price is unknown."""
    if not model:
        return None
    with _lock:
        rates = _overrides.get(model)
    if rates is None:
        return None
    return (input_tokens * rates[0] + output_tokens * rates[1]) / 1_000_000
