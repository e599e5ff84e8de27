"""Operations views: open trees, spend of closed trees by label, the CLI that shows them."""

from __future__ import annotations

import pytest

from coordinator import ChainMetadata, Coordinator, ExecutionConfig, ExecutionContext, report_usage
from coordinator.cli import main

CONFIG = ExecutionConfig(max_cost_usd=1.0, max_steps=10, max_retries_total=3)


def test_top_and_spend_views(coord: Coordinator, redis_url: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    meta = ChainMetadata(request_id="r", chain_id="tree-a", org_id="acme", team="search",
                         service="summariser")
    run = ExecutionContext(CONFIG, metadata=meta)
    child = run.spawn_child()
    child.wrap_llm_call(lambda: report_usage(cost_usd=0.25))
    child.close()
    assert coord.views.active_roots() == ["tree-a"]
    assert main(["--redis", redis_url, "top"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == [
        "tree-a", "summariser", "$0.2500", "$1.0000"]
    run.close()
    assert coord.views.active_roots() == []
    # the tree's total is counted once, at the root, under each of its labels
    assert coord.views.spend_view("org") == {"acme": 250_000}
    assert coord.views.spend_view("team") == {"search": 250_000}
    assert main(["--redis", redis_url, "spend"]) == 0
    out = capsys.readouterr().out
    assert "acme" in out and "$0.2500" in out and "summariser" in out
    # --redis after the command is used too (this one answers nothing: exit 2)
    assert main(["spend", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "Redis unavailable" in capsys.readouterr().err


def test_retention_and_lease_come_from_the_environment(redis_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUDGET_RETENTION_S", "120")
    monkeypatch.setenv("BUDGET_LEASE_MS", "5000")
    coord = Coordinator.from_url(redis_url, token_keys={"k": b"0123456789abcdef0"})
    try:
        assert coord.retention_s == 120 and coord.store.lease_ms == 5000
        with ExecutionContext(CONFIG, coordinator=coord) as run:
            run.wrap_llm_call(lambda: None)
        key = coord.keyspace.ctx(run.chain_id, run.chain_id)
        assert 0 < coord.client.ttl(key) <= 120  # the closed tree expires after it
    finally:
        coord.close()
