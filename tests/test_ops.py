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
    assert coord.store.active_roots() == ["tree-a"]
    assert main(["--redis", redis_url, "top"]) == 0
    assert "$0.2500 / $1.0000" in capsys.readouterr().out
    run.close()
    assert coord.store.active_roots() == []
    # the tree's total is counted once, at the root, under each of its labels
    assert coord.store.spend_view("org") == {"acme": 250_000}
    assert coord.store.spend_view("team") == {"search": 250_000}
    assert main(["--redis", redis_url, "spend"]) == 0
    out = capsys.readouterr().out
    assert "acme" in out and "$0.2500" in out and "summariser" in out
