"""What the dashboard and budgetctl show is true and the same: ages from creation, burn
only for running trees over a stated window, the same numbers in `budgetctl top` and the
API; spend totals with the unlabelled trees; a view that reads its own writes."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator import ChainMetadata, ExecutionConfig, ExecutionContext
from coordinator.cli import main
from coordinator.dashboard.live import Listener, Live
from coordinator.dashboard.service import Service
from tests.support.dashboard_server import Http, coordinator, dashboard, open_tree, spend

pytest.importorskip("starlette")

Capture = pytest.CaptureFixture[str]


def _wait(predicate: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _api_trees(http: Http) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in http.json("/api/trees?sort=age")["trees"]}


def _top(capsys: Capture, redis_url: str) -> dict[str, dict[str, Any]]:
    capsys.readouterr()
    assert main(["--redis", redis_url, "top", "--json", "--sort", "age"]) == 0
    return {t["id"]: t for t in json.loads(capsys.readouterr().out)["trees"]}


def test_age_and_burn_agree_with_budgetctl_top(redis_url: str, capsys: Capture) -> None:
    coord = coordinator(redis_url)
    busy = open_tree(coord, "busy-run", ceiling=2.0)
    spend(busy, 0.4)
    halted = open_tree(coord, "halted-run", ceiling=2.0)
    spend(halted, 0.3)
    halted.abort("enough")
    coord.store.flush()
    time.sleep(3)  # the stopped tree is 3 s old; it ran for a few ms
    with dashboard(redis_url) as http:
        _wait(lambda: _api_trees(http)["busy-run"]["usd_per_min"] > 0)  # an indexer pass
        before = time.monotonic()
        api = _api_trees(http)
        top = _top(capsys, redis_url)
        between = time.monotonic() - before  # both ages grow meanwhile
        for tree in ("busy-run", "halted-run"):
            assert api[tree]["age_s"] >= 3.0
            assert -1.0 <= top[tree]["age_s"] - api[tree]["age_s"] <= 1.0 + between
        # the busy tree spent $0.40 in the last minute: $0.40 per minute (not
        # extrapolated from its few seconds), the same number in both
        assert api["busy-run"]["usd_per_min"] == pytest.approx(0.4)
        assert top["busy-run"]["usd_per_min"] == pytest.approx(0.4)
        assert api["busy-run"]["minutes_to_ceiling"] == pytest.approx(1.6 / 0.4)
        # a stopped tree burns nothing and has no time to its ceiling
        assert api["halted-run"]["usd_per_min"] == 0.0
        assert api["halted-run"]["minutes_to_ceiling"] is None
        assert top["halted-run"]["usd_per_min"] is None
    busy.close()
    halted.close()
    coord.close()


def test_a_listing_reads_its_own_writes_without_the_indexer(redis_url: str) -> None:
    """No indexer runs here: a tree opened just before is listed by every sort at once
    (the default sort read the indexer's index only, which places it up to a pass later),
    at its place among the indexed trees, and counted."""
    coord = coordinator(redis_url)
    svc = Service({"": coord}, cache_s=0.25)
    new = open_tree(coord, "just-opened", ceiling=1.0, team="infra")
    spend(new, 0.2)
    coord.store.flush()
    for sort in ("spend", "fraction", "burn", "age"):
        listed = svc.trees("", sort=sort, since=time.time() * 1000)
        assert [t["id"] for t in listed["trees"]] == ["just-opened"], sort
        assert listed["total"] == 1 and listed["trees"][0]["spend_usd"] == pytest.approx(0.2)
    assert svc.trees("", label="team=infra", since=time.time() * 1000)["total"] == 1
    assert svc.trees("", label="team=research", since=time.time() * 1000)["trees"] == []
    new.close()
    coord.close()


def test_a_shared_read_older_than_an_event_is_not_served(redis_url: str) -> None:
    coord = coordinator(redis_url)
    svc = Service({"": coord}, cache_s=30.0)  # a long share, to see it is not used
    run = open_tree(coord, "shared-run", ceiling=1.0)
    coord.store.flush()
    assert svc.tree("", "shared-run")["contexts"]["shared-run"]["spend_usd"] == 0.0
    spend(run, 0.1)
    coord.store.flush()
    event_at = time.time() * 1000
    assert svc.tree("", "shared-run")["contexts"]["shared-run"]["spend_usd"] == 0.0  # shared
    fresh = svc.tree("", "shared-run", since=event_at)
    assert fresh["contexts"]["shared-run"]["spend_usd"] == pytest.approx(0.1)
    run.close()
    coord.close()


def test_a_change_before_the_first_poll_of_a_new_stream_is_reported(redis_url: str) -> None:
    """The live feed's first reading after a page connects is not a silent baseline:
    the stream is told to refresh after it, so a spend made between the page's render and
    that reading shows; and later changes are reported as before."""
    coord = coordinator(redis_url)
    svc = Service({"": coord})
    live = Live(svc.views, tick_s=0.5)
    run = open_tree(coord, "watched-run", ceiling=1.0)
    coord.store.flush()
    live._poll()  # the feed already watches other pages
    loop = asyncio.new_event_loop()
    listener = Listener("", frozenset({"watched-run"}), loop)
    live.add(listener)
    spend(run, 0.1)  # after the page rendered, before the feed's first reading
    coord.store.flush()

    def heard() -> list[dict[str, Any]]:
        loop.run_until_complete(asyncio.sleep(0.01))
        out = []
        while not listener.queue.empty():
            msg = listener.queue.get_nowait()
            assert msg is not None
            out.append(msg)
        return out

    before = time.time() * 1000
    live._poll()
    (msg,) = heard()
    assert msg["type"] == "change" and msg["roots"] == ["watched-run"]
    assert msg["at"] >= before  # the page's refresh asks for a read after this one
    live._poll()
    assert heard() == []  # nothing changed since
    spend(run, 0.1)
    coord.store.flush()
    live._poll()
    assert [m["roots"] for m in heard()] == [["watched-run"]]
    loop.close()
    run.close()
    coord.close()


def test_spend_total_is_every_closed_tree_labelled_or_not(
        redis_url: str, capsys: Capture) -> None:
    """A $0.99 unlabelled run is in the total and in an "unlabelled" row, in budgetctl
    and on the dashboard; the total is the sum of every tree closed that day."""
    coord = coordinator(redis_url)
    spent = {"labelled-run": 0.25, "team-only-run": 0.125, "bare-run": 0.99}
    trees = {"labelled-run": open_tree(coord, "labelled-run", ceiling=2.0)}
    config = ExecutionConfig(max_cost_usd=2.0, max_steps=10, max_retries_total=1)
    with ThreadPoolExecutor(1) as pool:  # (see open_tree: a root opens on its thread)
        trees["team-only-run"] = pool.submit(
            ExecutionContext, config, coordinator=coord,
            metadata=ChainMetadata(request_id="r1", chain_id="team-only-run",
                                   team="infra")).result()
        trees["bare-run"] = pool.submit(ExecutionContext, config,
                                        coordinator=coord).result()
    for name, ctx in trees.items():
        spend(ctx, spent[name])
        ctx.close()
    total = sum(spent.values())
    capsys.readouterr()
    assert main(["--redis", redis_url, "spend", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_usd"] == pytest.approx(total)
    assert out["unlabelled_usd"] == pytest.approx(0.99)
    assert main(["--redis", redis_url, "spend"]) == 0
    text = capsys.readouterr().out
    assert "total" in text and "$1.3650" in text and "unlabelled" in text and "$0.9900" in text
    with dashboard(redis_url) as http:
        data = http.json("/api/spend")
        assert data["total"]["closed"] == pytest.approx(total)
        assert data["unlabelled"]["closed"] == pytest.approx(0.99)
        assert data["days"][-1]["total"] == pytest.approx(total)
        assert data["days"][-1]["by"] == {"research": 0.25, "infra": 0.125}
        status, _, csv_text = http.request("GET", "/api/spend.csv",
                                           token="viewer-token-0123456789abcdef")
        assert status == 200 and ",total,,usd,1.365," in csv_text
    coord.close()
