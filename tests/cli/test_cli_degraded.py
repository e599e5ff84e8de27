"""``budgetctl tree`` shows what the budget's edge did: each context's degraded calls
(subtree included), the newest calls with the model that ran (``gpt-4o-mini (from
gpt-4o)``) and the refusals of a final reserve folded by reason, the ``degraded`` and
``budget_warning`` events; ``--json`` carries ``degraded_calls`` and ``degraded_from``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coordinator import Coordinator
from tests.support.cli import budgetctl
from tests.support.degrade import edge_tree

Capture = pytest.CaptureFixture[str]


def test_tree_shows_degraded_counts_calls_refusals_and_edge_events(
        coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    root, kid = edge_tree(coord)
    code, out, _ = budgetctl(capsys, redis_url, "tree", "edge-tree")
    assert code == 0
    head, _, rest = out.partition("calls, newest first:")
    calls, _, events = rest.partition("events, newest first:")
    root_line, kid_line = head.strip().splitlines()
    assert "$0.0700 / $0.1000" in root_line and "10 calls (2 degraded)  running" in root_line
    assert kid_line.endswith("4 calls (1 degraded)  running, 3 refused: final_reserve")

    lines = [ln for ln in calls.splitlines() if ln.strip()]
    assert len(lines) == 8, lines  # 10 newest: the 3 refusals are one line
    refused, *ran = lines
    assert f"{kid.chain_id}  llm  lookup  refused: final_reserve (x3)  usd needs" in refused
    assert "before the final reserve of $0.03" in refused
    # (calls of two contexts in the same ms may come in either order)
    assert sorted(ln.split("  ", 1)[1] for ln in ran) == sorted([
        *[f"{kid.chain_id}  llm  lookup  $0.0020  ok"] * 3,
        f"{kid.chain_id}  llm  answer  gpt-4o-mini (from gpt-4o)  $0.0008  1,000/1,000 tokens  ok",
        "edge-tree  llm  answer  gpt-4o-mini (from gpt-4o)  $0.0008  1,000/1,000 tokens  ok",
        *["edge-tree  llm  answer  gpt-4o  $0.0125  1,000/1,000 tokens  ok"] * 2])

    said = [ln.split("  ", 2)[2] for ln in events.splitlines() if ln.strip()]
    assert said == ["degraded  ran on gpt-4o-mini instead of gpt-4o (model ladder)",
                    "degraded  ran on gpt-4o-mini instead of gpt-4o (model ladder)",
                    "budget_warning  spend reached 50% of max_cost_usd ($0.05 of $0.10)"]

    code, out, _ = budgetctl(capsys, redis_url, "tree", "edge-tree", "--calls", "0")
    assert code == 0 and "calls, newest first" not in out and "budget_warning" in out
    kid.close()
    root.close()


def test_tree_json_carries_degraded_calls_and_degraded_from(
        coord: Coordinator, redis_url: str, capsys: Capture) -> None:
    root, kid = edge_tree(coord)
    code, out, _ = budgetctl(capsys, redis_url, "tree", "edge-tree", "--json", "--calls", "20")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"read_at_ms", "tree", "recent_calls", "events"}
    tree = doc["tree"]
    assert (tree["degraded_calls"], tree["children"][0]["degraded_calls"]) == (2, 1)
    assert tree["children"][0]["refusals"] == {"final_reserve": 3}
    calls = doc["recent_calls"]
    assert sum(c["count"] for c in calls) == 13
    models = sorted((c["context"], c["model"], c["degraded_from"] or "") for c in calls
                    if c["model"])
    assert models == sorted([(kid.chain_id, "gpt-4o-mini", "gpt-4o"),
                             ("edge-tree", "gpt-4o-mini", "gpt-4o"),
                             *[("edge-tree", "gpt-4o", "")] * 5])
    assert all(c["degraded_from"] is None for c in calls if c["model"] == "gpt-4o")
    (refused,) = [c for c in calls if c["refused"]]
    assert (refused["refused"], refused["count"], refused["cost_usd"]) == ("final_reserve", 3, 0.0)
    assert {e["event_type"] for e in doc["events"]} == {"degraded", "budget_warning"}
    # budgetctl top's rows carry the count too
    code, out, _ = budgetctl(capsys, redis_url, "top", "--json")
    assert json.loads(out)["trees"][0]["degraded_calls"] == 2
    kid.close()
    root.close()


def test_budgetctl_as_an_operator_runs_it(coord: Coordinator, redis_url: str) -> None:
    root, kid = edge_tree(coord)
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "--redis", redis_url,
                           "tree", "edge-tree"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "10 calls (2 degraded)" in done.stdout
    assert "gpt-4o-mini (from gpt-4o)" in done.stdout
    kid.close()
    root.close()
