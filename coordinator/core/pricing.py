"""USD prices of token usage: user overrides first, then the maintained price table.

The table is LiteLLM's model price map (``model_prices_and_context_window.json``), the
map that LiteLLM's own ``response_cost`` and the ``tokencost`` package are computed from.
It is read, in this order, from:

1. the JSON file named by ``BUDGET_PRICE_TABLE`` (LiteLLM's format or this package's);
2. the copy bundled inside an installed ``litellm`` (read as a file, never imported:
   importing litellm is slow and fetches prices from the internet by default);
3. ``coordinator/core/price_table.json``, a snapshot of the chat models of that map shipped
   in the wheel (regenerate it with ``deploy/update_price_table.py``).

Nothing is ever fetched from the network at run time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidUsageError

SNAPSHOT = Path(__file__).with_name("price_table.json")
ENV_TABLE = "BUDGET_PRICE_TABLE"
LITELLM_FILE = "model_prices_and_context_window_backup.json"
# Modes of LiteLLM's map that are billed per input/output token like a chat call.
TOKEN_MODES = ("chat", "completion", "responses")
_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class ModelPrice:
    """The price of one model in USD per million tokens."""

    input_per_mtok: float
    """Uncached input tokens."""
    output_per_mtok: float
    """Output tokens (reasoning tokens included)."""
    cache_read_per_mtok: float | None = None
    """Input tokens read from the prompt cache (None: charged as input)."""
    cache_write_per_mtok: float | None = None
    """Input tokens written to the prompt cache (None: charged as input)."""
    provider: str | None = None
    """The table's provider for this entry (LiteLLM's ``litellm_provider``)."""
    source: str = ""
    """``override`` or the table it came from."""


@dataclass(frozen=True)
class _Table:
    source: str
    models: dict[str, ModelPrice]


_overrides: dict[str, ModelPrice] = {}
_lock = threading.Lock()
_table: _Table | None = None
_generation = 0
"""Changes whenever a price may have: set_price, clear_prices, load_price_table."""


MAX_RATE = 1e6
"""The highest price accepted, in USD per million tokens ($1 a token)."""


def _check_rate(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        0 <= value <= MAX_RATE  # (NaN fails it; an int of any size compares exactly)
    ):
        raise InvalidUsageError(f"{name} must be a price from 0 to {MAX_RATE:g} USD per "
                                f"million tokens; got {value!r}")


def set_price(
    model: str,
    *,
    input_per_mtok: float,
    output_per_mtok: float,
    cache_read_per_mtok: float | None = None,
    cache_write_per_mtok: float | None = None,
) -> None:
    """Override the price of ``model`` in USD per million tokens (wins over the table,
    also for provider-prefixed names such as ``"openai/<model>"``)."""
    if not isinstance(model, str) or not model:
        raise InvalidUsageError(f"model must be a non-empty string; got {model!r}")
    for name, value in (("input_per_mtok", input_per_mtok),
                        ("output_per_mtok", output_per_mtok),
                        ("cache_read_per_mtok", cache_read_per_mtok),
                        ("cache_write_per_mtok", cache_write_per_mtok)):
        if value is None and name in ("input_per_mtok", "output_per_mtok"):
            raise InvalidUsageError(f"{name} is required")
        _check_rate(name, value)
    price = ModelPrice(float(input_per_mtok), float(output_per_mtok),
                       None if cache_read_per_mtok is None else float(cache_read_per_mtok),
                       None if cache_write_per_mtok is None else float(cache_write_per_mtok),
                       source="override")
    global _generation
    with _lock:
        _overrides[model] = price
        _generation += 1


def clear_prices() -> None:
    """Remove every override."""
    global _generation
    with _lock:
        _overrides.clear()
        _generation += 1


def generation() -> int:
    """A number that changes whenever a price may have (an override set or cleared, the
    table reloaded): what a cache of prices is keyed by (context/edge.py)."""
    return _generation


# -- the table --------------------------------------------------------------------------


def _per_mtok(per_token: Any) -> float | None:
    if isinstance(per_token, bool) or not isinstance(per_token, (int, float)):
        return None
    if not 0 <= per_token <= MAX_RATE / 1_000_000:  # (NaN fails it, a huge int too)
        return None
    # Round away the binary noise of per-token floats (2.5e-06 * 1e6 = 2.4999999999999996).
    return round(per_token * 1_000_000, 9)


def snapshot_from_litellm(prices: Mapping[str, Any], source: str) -> dict[str, Any]:
    """This package's compact table from LiteLLM's price map: models billed per token
    (chat, completion, responses) as ``[provider, input, output, cache_read, cache_write]``
    in USD per million tokens."""
    models: dict[str, list[Any]] = {}
    for name, entry in prices.items():
        if not isinstance(entry, Mapping) or entry.get("mode") not in TOKEN_MODES:
            continue
        inp = _per_mtok(entry.get("input_cost_per_token"))
        out = _per_mtok(entry.get("output_cost_per_token"))
        if inp is None or out is None:
            continue
        provider = entry.get("litellm_provider")
        models[name] = [provider if isinstance(provider, str) else None, inp, out,
                        _per_mtok(entry.get("cache_read_input_token_cost")),
                        _per_mtok(entry.get("cache_creation_input_token_cost"))]
    return {"_meta": {"source": source, "unit": "USD per million tokens",
                      "columns": ["provider", "input", "output", "cache_read", "cache_write"]},
            "models": models}


def dump_snapshot(snapshot: Mapping[str, Any]) -> str:
    """The snapshot as JSON with one model per line (small, readable diffs)."""
    lines = [f"  {json.dumps(name)}: {json.dumps(row)}"
             for name, row in sorted(snapshot["models"].items())]
    return ('{\n  "_meta": ' + json.dumps(snapshot["_meta"]) + ',\n  "models": {\n'
            + ",\n".join("  " + line for line in lines) + "\n  }\n}\n")


def _parse(data: Any, source: str) -> _Table:
    if not isinstance(data, Mapping):
        raise InvalidUsageError(f"price table {source} is not a JSON object")
    if "models" not in data or "_meta" not in data:
        data = snapshot_from_litellm(data, source)
    source = str(data["_meta"].get("source") or source)
    models: dict[str, ModelPrice] = {}
    for name, row in data["models"].items():
        if not isinstance(row, list) or len(row) != 5:
            raise InvalidUsageError(f"price table {source}: {name} must be [provider, input, "
                                    "output, cache_read, cache_write]")
        provider, inp, out, cread, cwrite = row
        for rate, value in (("input", inp), ("output", out), ("cache_read", cread),
                            ("cache_write", cwrite)):
            _check_rate(f"price table {source}: {name} {rate}",
                        "missing" if value is None and rate in ("input", "output") else value)
        models[name] = ModelPrice(inp, out, cread, cwrite, provider, source)
    return _Table(source, models)


def _litellm_file() -> Path | None:
    """The price map bundled with an installed litellm, located without importing it."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / LITELLM_FILE
        if path.is_file():
            return path
    return None


def _read(path: Path, source: str) -> _Table:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidUsageError(f"cannot read price table {path}: {exc}") from exc
    return _parse(data, source)


def _load_default() -> _Table:
    env = os.environ.get(ENV_TABLE)
    if env:
        return _read(Path(env), f"{ENV_TABLE}={env}")
    bundled = _litellm_file()
    if bundled is not None:
        return _read(bundled, f"installed litellm ({bundled})")
    return _read(SNAPSHOT, f"snapshot {SNAPSHOT.name}")


def _current_table() -> _Table:
    global _table
    with _lock:
        if _table is None:
            _table = _load_default()
        return _table


def load_price_table(path: str | os.PathLike[str] | None = None) -> str:
    """(Re)load the price table from ``path`` (LiteLLM's format or this package's), or
    from the default sources when None. Returns the table's source. Overrides stay."""
    global _table, _generation
    table = _load_default() if path is None else _read(Path(path), str(path))
    with _lock:
        _table = table
        _generation += 1
    return table.source


def price_table_source() -> str:
    """Where the table in use came from (file, and LiteLLM version for the snapshot)."""
    return _current_table().source


# -- lookups ----------------------------------------------------------------------------


def _candidates(model: str, provider: str | None) -> list[tuple[str, str | None]]:
    """Names to try, most specific first, each with the provider that a table entry
    reached by dropping a ``provider/`` prefix must have."""
    names: list[tuple[str, str | None]] = []
    bases = [model] if model == model.lower() else [model, model.lower()]
    for base in bases:
        if provider and not base.startswith(f"{provider}/"):
            names.append((f"{provider}/{base}", None))
        names.append((base, None))
        prefix, sep, rest = base.partition("/")
        if sep and rest:
            names.append((rest, prefix))
    dated = [(_DATE_SUFFIX.sub("", n), p) for n, p in names if _DATE_SUFFIX.search(n)]
    return names + dated


def model_price(model: str | None, provider: str | None = None) -> ModelPrice | None:
    """The price of ``model`` (``"gpt-4o"``, ``"openai/gpt-4o"``, a dated snapshot name
    whose undated name is known, ...): an override, else the table, else None.

    ``provider`` (a slug such as ``"azure"``) prefers the table's ``provider/model``
    entry when there is one.
    """
    if not model or not isinstance(model, str):
        return None
    names = _candidates(model, provider)
    with _lock:
        for name, _ in names:
            price = _overrides.get(name)
            if price is not None:
                return price
    table = _current_table().models
    for name, required in names:
        price = table.get(name)
        # "openai/gpt-4o" may use the "gpt-4o" entry, "mycorp/gpt-4o" may not.
        if price is not None and (required is None or price.provider == required):
            return price
    return None


def price_usd(
    model: str | None,
    input_tokens: int,
    output_tokens: int,
    *,
    cache_read_input_tokens: int = 0,
    cache_creation_input_tokens: int = 0,
    provider: str | None = None,
) -> float | None:
    """The USD cost of a call, or None when the model's price is unknown.

    ``input_tokens`` counts every input token once; the cache reads and writes among them
    are priced at the model's cache rates (at the input rate where it has none).
    """
    for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                        ("cache_read_input_tokens", cache_read_input_tokens),
                        ("cache_creation_input_tokens", cache_creation_input_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidUsageError(f"{name} must be a non-negative integer; got {value!r}")
    if cache_read_input_tokens + cache_creation_input_tokens > input_tokens:
        raise InvalidUsageError(
            f"cache reads ({cache_read_input_tokens}) and writes "
            f"({cache_creation_input_tokens}) exceed input_tokens ({input_tokens})")
    price = model_price(model, provider)
    if price is None:
        return None
    plain = input_tokens - cache_read_input_tokens - cache_creation_input_tokens
    read_rate = price.input_per_mtok if price.cache_read_per_mtok is None \
        else price.cache_read_per_mtok
    write_rate = price.input_per_mtok if price.cache_write_per_mtok is None \
        else price.cache_write_per_mtok
    return (plain * price.input_per_mtok + cache_read_input_tokens * read_rate
            + cache_creation_input_tokens * write_rate
            + output_tokens * price.output_per_mtok) / 1_000_000
