"""Spend by provider and model: every closed tree's calls, by ``provider|model`` in USD,
summing to the day's total (``unknown``: calls that named none), in budgetctl spend, the
API and the CSV; the tree's hash expires with the tree."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.store.model_spend import model_of, model_rows
from tests.support.dashboard_server import coordinator, dashboard
from tests.support.spend_models_setup import EXPECTED, TOTAL_MICRO, close_trees

pytest.importorskip("starlette")


def test_rows_take_the_rest_as_unknown_and_never_exceed_the_spend() -> None:
    assert model_rows({"a|x": 300, "b|y": 100}, 500) == {"a|x": 300, "b|y": 100,
                                                         "unknown": 100}
    assert model_rows({"a|x": 300, "b|y": 100}, 350) == {"a|x": 300, "b|y": 50}
    assert model_rows({}, 7) == {"unknown": 7}
    assert model_of("openai|-") == {"provider": "openai", "model": None}
    assert model_of("unknown") == {"provider": None, "model": None}


def _micro(usd: float) -> int:
    return round(usd * 1e6)


def test_spend_by_provider_and_model_sums_to_the_days_total(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    coord = coordinator(redis_url)
    close_trees(coord)
    capsys.readouterr()
    assert main(["--redis", redis_url, "spend", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert _micro(out["total_usd"]) == TOTAL_MICRO
    models: list[dict[str, Any]] = out["models"]
    assert [m["usd"] for m in models] == sorted((m["usd"] for m in models), reverse=True)
    assert {(m["provider"], m["model"]): _micro(m["usd"]) for m in models} == {
        ("openai", "gpt-4o"): 312_500, ("anthropic", "claude-3-haiku"): 125_000,
        ("openai", "gpt-4o-mini"): 500_000, (None, None): 31_250}
    assert sum(_micro(m["usd"]) for m in models) == TOTAL_MICRO

    assert main(["--redis", redis_url, "spend"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for field, micro in EXPECTED.items():
        assert any(line.split() == ["model", field, f"${micro / 1e6:.4f}"] for line in lines), (
            field, lines)

    with dashboard(redis_url) as http:
        data = http.json("/api/spend")
        rows = {r["value"]: r for r in data["rows"] if r["label"] == "model"}
        assert {v: _micro(r["closed"]) for v, r in rows.items()} == EXPECTED
        assert all(r["unit"] == "usd" and r["open"] == 0 for r in rows.values())
        assert sum(_micro(r["closed"]) for r in rows.values()) == _micro(
            data["total"]["closed"])
        status, _, csv_text = http.request("GET", "/api/spend.csv",
                                           token="viewer-token-0123456789abcdef")
        assert status == 200 and ",model,openai|gpt-4o,usd,0.3125,0" in csv_text

    key = coord.keyspace.by_model("bare-run")
    assert coord.store.client.ttl(key) > 0  # expires with the tree's other keys
    coord.close()
