"""The edge of context data: limits, key checks and the JSON encoding of values (pure
logic, no Redis)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidConfigError
from ..models_base import check_count, decimal_text
from .errors import DataKeyError, DataTooLargeError, DataValueError

MAX_DEPTH = 100
"""The deepest nesting of lists and maps a value may have."""


@dataclass(frozen=True)
class DataLimits:
    """Limits of context data, enforced before anything is written."""

    max_key_chars: int = 256
    """Longest key, in characters."""
    max_value_bytes: int = 1 << 20
    """Largest JSON encoding of one value (UTF-8 bytes): 1 MiB."""
    max_context_bytes: int = 16 << 20
    """Largest data of one context (keys and JSON values, UTF-8 bytes): 16 MiB."""

    def __post_init__(self) -> None:
        _check_limits({name: (name, getattr(self, name)) for name in _FIELDS})

    @classmethod
    def from_env(cls) -> DataLimits:
        """Defaults, with ``BUDGET_DATA_MAX_CONTEXT_BYTES`` and
        ``BUDGET_DATA_MAX_VALUE_BYTES`` applied when set (decimal digits)."""
        given = {name: (env, os.environ[env]) for env, name in (
            ("BUDGET_DATA_MAX_CONTEXT_BYTES", "max_context_bytes"),
            ("BUDGET_DATA_MAX_VALUE_BYTES", "max_value_bytes")) if os.environ.get(env)}
        return cls(**_check_limits({name: (env, decimal_text(text))
                                    for name, (env, text) in given.items()}))


_FIELDS = ("max_key_chars", "max_value_bytes", "max_context_bytes")


def _check_limits(given: dict[str, tuple[str, Any]]) -> dict[str, int]:
    """Each limit (name -> (what gave it, value)) an integer from 1 to 2**53 - 1 (exact
    in the scripts); InvalidConfigError lists those that are not."""
    problems = []
    for label, value in given.values():
        try:
            check_count(value, label, minimum=1, maximum=2 ** 53 - 1)
        except ValueError as exc:
            problems.append({"loc": (label,), "msg": str(exc), "input": value})
    if problems:
        raise InvalidConfigError("DataLimits", problems)
    return {name: value for name, (_, value) in given.items()}


def check_key(key: object, limits: DataLimits) -> str:
    """``key`` if it is a usable data key, else :class:`DataKeyError`."""
    if not isinstance(key, str) or not 1 <= len(key) <= limits.max_key_chars:
        raise DataKeyError(key, limits.max_key_chars)
    try:
        key.encode()
    except UnicodeEncodeError:
        raise DataKeyError(key, limits.max_key_chars) from None
    return key


def _check(key: str, value: object, depth: int) -> None:
    """Walks a value; raises :class:`DataValueError` at the first part that is not JSON
    (json.dumps would turn a tuple into a list and accept NaN)."""
    if depth > MAX_DEPTH:
        raise DataValueError(key, f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataValueError(key, f"{value!r} is not a finite number")
        return
    if isinstance(value, list):
        for item in value:
            _check(key, item, depth + 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise DataValueError(key, f"map key {k!r} is not a string")
            _check(key, item, depth + 1)
        return
    raise DataValueError(key, f"{type(value).__name__} {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def encode_value(key: str, value: object, limits: DataLimits) -> str:
    """The JSON text stored for ``value`` (compact, UTF-8); raises
    :class:`DataValueError` or :class:`DataTooLargeError`."""
    _check(key, value, 0)
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise DataValueError(key, "a string holds a lone surrogate (not Unicode text)") from None
    if size > limits.max_value_bytes:
        raise DataTooLargeError("a value's JSON", size, limits.max_value_bytes, key)
    return text


def decode_value(text: str) -> Any:
    """The value stored as ``text``."""
    return json.loads(text)

