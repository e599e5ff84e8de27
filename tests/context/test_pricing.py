"""Prices: the vendored LiteLLM snapshot, provider-prefixed and dated names, cache rates,
user overrides winning, other tables (file, env, an installed litellm never imported),
and the price a real wrapped call is charged."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import ExecutionConfig, ExecutionContext, WrapOptions, report_usage
from coordinator.core import pricing
from coordinator.core.pricing import (
    clear_prices,
    dump_snapshot,
    load_price_table,
    model_price,
    price_usd,
    set_price,
    snapshot_from_litellm,
)
from coordinator.errors import InvalidUsageError

ROOT = Path(__file__).resolve().parents[2]

LITELLM_MAP = {
    "sample_spec": {"mode": "one of: chat, embedding, ...", "input_cost_per_token": 0.0},
    "acme-chat-1": {"litellm_provider": "acme", "mode": "chat",
                    "input_cost_per_token": 2e-06, "output_cost_per_token": 8e-06,
                    "cache_read_input_token_cost": 5e-07},
    "acme/acme-chat-1": {"litellm_provider": "acme", "mode": "chat",
                         "input_cost_per_token": 3e-06, "output_cost_per_token": 9e-06},
    "acme-embed": {"litellm_provider": "acme", "mode": "embedding",
                   "input_cost_per_token": 1e-07, "output_cost_per_token": 0.0},
    "acme-image": {"litellm_provider": "acme", "mode": "image_generation",
                   "output_cost_per_image": 0.04},
    "acme-free-text": {"litellm_provider": "acme", "mode": "completion",
                       "input_cost_per_token": 0, "output_cost_per_token": 0},
}


@pytest.fixture(autouse=True)
def snapshot_table() -> Iterator[None]:
    """Every test starts on the shipped snapshot with no override, whatever the machine
    has installed, and leaves the default sources behind."""
    load_price_table(pricing.SNAPSHOT)
    clear_prices()
    yield
    clear_prices()
    load_price_table()


def test_snapshot_is_litellm_map_with_its_source_and_date() -> None:
    meta = json.loads(pricing.SNAPSHOT.read_text())["_meta"]
    assert meta["source"].startswith("litellm ") and "taken 20" in meta["source"]
    assert pricing.price_table_source() == meta["source"]
    gpt = model_price("gpt-4o")
    assert gpt is not None
    assert (gpt.input_per_mtok, gpt.output_per_mtok, gpt.cache_read_per_mtok) == (2.5, 10.0, 1.25)
    assert gpt.provider == "openai" and gpt.source == meta["source"]


def test_provider_prefixed_dated_and_cased_names_find_the_entry() -> None:
    base = model_price("claude-sonnet-4-5")
    assert base is not None and base.provider == "anthropic"
    assert model_price("anthropic/claude-sonnet-4-5") == base
    assert model_price("claude-sonnet-4-5", provider="anthropic") == base
    assert model_price("openai/gpt-4o") == model_price("gpt-4o")
    assert model_price("GPT-4o") == model_price("gpt-4o")
    # A dated name the table does not list falls back to its undated name...
    assert model_price("claude-sonnet-4-5-29990101") == base
    # ...but a listed dated snapshot keeps its own price.
    old = model_price("gpt-4o-2024-05-13")
    assert old is not None and old.input_per_mtok == 5.0


def test_a_prefix_of_another_provider_is_not_priced_as_that_model() -> None:
    assert model_price("gpt-4o") is not None
    assert model_price("mycorp/gpt-4o") is None
    assert model_price("no-such-model-xyz") is None
    assert price_usd("no-such-model-xyz", 100, 100) is None
    assert price_usd(None, 100, 100) is None


def test_provider_hint_prefers_that_providers_own_entry() -> None:
    azure = model_price("gpt-4o", provider="azure")
    assert azure is not None and azure.provider == "azure"
    openai = model_price("gpt-4o", provider="openai")
    assert openai is not None and openai.provider == "openai"


def test_cache_reads_and_writes_are_priced_at_their_rates_once() -> None:
    # gpt-4o: input 2.5, cached input 1.25, output 10 USD per million tokens.
    cost = price_usd("gpt-4o", 1000, 100, cache_read_input_tokens=400)
    assert cost == pytest.approx((600 * 2.5 + 400 * 1.25 + 100 * 10) / 1e6)
    # claude-sonnet-4-5: input 3, cache read 0.3, cache write 3.75, output 15.
    cost = price_usd("anthropic/claude-sonnet-4-5", 4521, 393, cache_read_input_tokens=3000,
                     cache_creation_input_tokens=1500)
    assert cost == pytest.approx((21 * 3 + 3000 * 0.3 + 1500 * 3.75 + 393 * 15) / 1e6)
    # The two-argument form prices everything at the plain input rate.
    assert price_usd("gpt-4o", 1000, 0) == pytest.approx(1000 * 2.5 / 1e6)


def test_overrides_win_for_every_name_of_the_model_and_can_be_cleared() -> None:
    set_price("gpt-4o", input_per_mtok=1.0, output_per_mtok=2.0)
    assert price_usd("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert price_usd("openai/gpt-4o", 1_000_000, 0) == pytest.approx(1.0)
    # No cache rate given: cache reads cost the override's input rate, not the table's.
    assert price_usd("gpt-4o", 1_000_000, 0, cache_read_input_tokens=500_000) == \
        pytest.approx(1.0)
    set_price("my-finetune", input_per_mtok=4.0, output_per_mtok=8.0, cache_read_per_mtok=0.4)
    assert price_usd("my-finetune", 1_000_000, 0, cache_read_input_tokens=1_000_000) == \
        pytest.approx(0.4)
    price = model_price("my-finetune")
    assert price is not None and price.source == "override"
    clear_prices()
    assert price_usd("gpt-4o", 1_000_000, 0) == pytest.approx(2.5)
    assert model_price("my-finetune") is None


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "3"])
def test_invalid_override_is_refused_and_changes_nothing(bad: object) -> None:
    with pytest.raises(InvalidUsageError, match="input_per_mtok"):
        set_price("gpt-4o", input_per_mtok=bad, output_per_mtok=1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError, match="cache_read_per_mtok"):
        set_price("gpt-4o", input_per_mtok=1.0, output_per_mtok=1.0,
                  cache_read_per_mtok=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # InvalidUsageError is a ValueError too
        set_price("", input_per_mtok=1.0, output_per_mtok=1.0)
    assert price_usd("gpt-4o", 1_000_000, 0) == pytest.approx(2.5)


def test_inconsistent_token_counts_are_refused() -> None:
    with pytest.raises(InvalidUsageError, match="exceed input_tokens"):
        price_usd("gpt-4o", 10, 0, cache_read_input_tokens=8, cache_creation_input_tokens=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidUsageError, match="non-negative integer"):
            price_usd("gpt-4o", bad, 0)  # type: ignore[arg-type]


def test_snapshot_from_litellm_keeps_token_billed_models_only(tmp_path: Path) -> None:
    snap = snapshot_from_litellm(LITELLM_MAP, "test map")
    assert sorted(snap["models"]) == ["acme-chat-1", "acme-free-text", "acme/acme-chat-1"]
    assert snap["models"]["acme-chat-1"] == ["acme", 2.0, 8.0, 0.5, None]
    # The dump is what ships: one model per line, and it loads back to the same prices.
    text = dump_snapshot(snap)
    assert text.count("\n") == len(snap["models"]) + 5
    path = tmp_path / "table.json"
    path.write_text(text)
    assert load_price_table(path) == "test map"
    assert price_usd("acme-chat-1", 1_000_000, 1_000_000) == pytest.approx(10.0)
    assert price_usd("acme/acme-chat-1", 1_000_000, 0) == pytest.approx(3.0)
    assert model_price("gpt-4o") is None  # the whole table was replaced


def test_a_litellm_format_file_loads_directly_and_bad_files_are_refused(
        tmp_path: Path) -> None:
    path = tmp_path / "model_prices.json"
    path.write_text(json.dumps(LITELLM_MAP))
    load_price_table(path)
    assert price_usd("acme-chat-1", 1_000_000, 0, cache_read_input_tokens=1_000_000) == \
        pytest.approx(0.5)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(InvalidUsageError, match="cannot read price table"):
        load_price_table(tmp_path / "broken.json")
    with pytest.raises(InvalidUsageError, match="cannot read price table"):
        load_price_table(tmp_path / "missing.json")
    # A failed load keeps the table in use.
    assert model_price("acme-chat-1") is not None


def _price_in_subprocess(env: dict[str, str], model: str) -> dict[str, object]:
    code = (
        "import json, sys\n"
        "from coordinator.core import pricing\n"
        f"p = pricing.model_price({model!r})\n"
        "print(json.dumps({'source': pricing.price_table_source(),\n"
        "                  'input': p.input_per_mtok if p else None,\n"
        "                  'litellm_imported': 'litellm' in sys.modules}))\n"
    )
    inherited = {k: v for k, v in os.environ.items() if k != pricing.ENV_TABLE}
    out = subprocess.run([sys.executable, "-c", code], env={**inherited, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_env_variable_names_the_table(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(LITELLM_MAP))
    got = _price_in_subprocess({pricing.ENV_TABLE: str(path)}, "acme-chat-1")
    assert got["input"] == 2.0 and "BUDGET_PRICE_TABLE" in str(got["source"])


def test_an_installed_litellm_table_is_read_without_importing_litellm(tmp_path: Path) -> None:
    package = tmp_path / "site" / "litellm"
    package.mkdir(parents=True)
    # Importing this package fails loudly: the table must be read as a file only.
    (package / "__init__.py").write_text("raise ImportError('litellm must not be imported')\n")
    (package / pricing.LITELLM_FILE).write_text(json.dumps(LITELLM_MAP))
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    got = _price_in_subprocess(env, "acme-chat-1")
    assert got["input"] == 2.0
    assert "installed litellm" in str(got["source"])
    assert got["litellm_imported"] is False


def test_without_litellm_the_snapshot_is_used() -> None:
    if importlib.util.find_spec("litellm") is not None:
        pytest.skip("litellm is installed here: its own table is used")
    got = _price_in_subprocess({}, "gpt-4o")
    assert str(got["source"]).startswith("litellm ") and "snapshot" not in str(got["source"])
    assert got["input"] == 2.5


def test_a_wrapped_call_reporting_tokens_is_charged_at_the_table_price(coord: object) -> None:
    config = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=2)
    with ExecutionContext(config) as ctx:
        ctx.wrap_llm_call(lambda: report_usage(input_tokens=10_000, output_tokens=2_000,
                                               model="openai/gpt-4o"),
                          WrapOptions(provider="openai", cost_estimate_hint=0.1))
        set_price("gpt-4o", input_per_mtok=10.0, output_per_mtok=10.0)
        ctx.wrap_llm_call(lambda: report_usage(input_tokens=10_000, output_tokens=2_000),
                          WrapOptions(provider="openai", model="gpt-4o",
                                      cost_estimate_hint=0.1))
        snap = ctx.get_snapshot()
    table = (10_000 * 2.5 + 2_000 * 10) / 1e6
    override = (12_000 * 10) / 1e6
    assert snap.cost_usd_accumulated == pytest.approx(table + override)
    assert [n.cost_usd for n in snap.nodes] == pytest.approx([table, override])


@pytest.mark.slow
def test_the_wheel_ships_the_snapshot_and_prices_from_it(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=240)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert "coordinator/core/price_table.json" in z.namelist()
        z.extractall(tmp_path / "site")
    # The unpacked wheel alone (not the checkout) prices from its own snapshot.
    code = ("import coordinator.core.pricing as p; print(p.SNAPSHOT.parents[2], "
            "p.price_usd('openai/gpt-4o', 1_000_000, 0))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, text=True,
                         capture_output=True, timeout=60,
                         env={**{k: v for k, v in os.environ.items()
                                 if k != pricing.ENV_TABLE},
                              "PYTHONPATH": str(tmp_path / "site")})
    where, price = out.stdout.split()
    assert Path(where) == tmp_path / "site" and float(price) == 2.5
