"""The models' base class and the value checks their validators share: frozen,
keyword-only, validation errors raised as :class:`coordinator.errors.InvalidConfigError`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import FrozenModelError, InvalidConfigError


class _Frozen(BaseModel):
    """Base: frozen, no unknown fields, and validation errors raised as our typed error."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def __init__(self, *args: Any, **data: Any) -> None:
        # The specifications write these as dataclasses: fields may come by position too.
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional "
                            f"arguments ({len(args)} given)")
        for name, value in zip(names, args, strict=False):  # fewer args than fields
            if name in data:
                raise TypeError(f"{type(self).__name__} got multiple values for {name!r}")
            data[name] = value
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = [dict(e) for e in exc.errors(include_url=False, include_context=False)]
            raise InvalidConfigError(type(self).__name__, problems) from None

    # The specifications' models are frozen dataclasses, whose mutation raises
    # dataclasses.FrozenInstanceError (an AttributeError): code written for them catches it.
    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenModelError(type(self).__name__, name)

    def __delattr__(self, name: str) -> None:
        raise FrozenModelError(type(self).__name__, name)


MAX_USD = 1e9
"""The largest USD amount accepted anywhere: a ceiling, an estimate, a reported cost.
In micro-USD it stays below 2**53, the integers Redis's Lua keeps exact."""
MAX_COUNT = 10**15
"""The largest count accepted anywhere: a token, step or retry limit, a token amount."""
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000
"""Ten years: the longest timeout accepted."""
MAX_LABEL = 256
"""The longest label (org, team, service, user, model, tag, operation name) accepted."""


def in_range(value: object, low: float, high: float) -> bool:
    """Whether ``value`` is a real number (not a bool) from ``low`` to ``high``: the range
    check also rejects NaN, infinities and ints too large for a float."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and low <= value <= high)


def decimal_text(value: object) -> object:
    """``value`` as an int when it is a string of ASCII decimal digits (fewer than 20, so
    no huge int is ever built from a setting), else ``value`` as given, for the range
    check that follows to refuse."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
        return int(value)
    return value


def check_usd(value: Any, name: str, *, positive: bool = False) -> float:
    """``value`` as a USD amount: a real number (not a bool or a string), finite, at least 0
    (``positive``: at least one micro-dollar, the smallest amount the ledger counts) and at
    most MAX_USD. Raises ValueError."""
    if not in_range(value, 1e-6 if positive else 0, MAX_USD):
        least = "one micro-dollar (1e-6)" if positive else "0"
        raise ValueError(f"{name} must be a number from {least} to {MAX_USD:g}")
    return float(value)


def check_count(value: Any, name: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """``value`` as an integer count (not a bool) from ``minimum`` to ``maximum``. Raises
    ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}")
    return value


def check_slug(slug: Any) -> str:
    """A provider slug: letters and digits, with ``-``, ``_`` and ``.`` (at most 64).
    Raises ValueError."""
    if not isinstance(slug, str) or not 0 < len(slug) <= 64 or not (
        slug.replace("-", "").replace("_", "").replace(".", "").isalnum() and slug.isascii()
    ):
        raise ValueError(f"provider slug {slug!r} must be 1-64 letters or digits (with - _ .)")
    return slug

