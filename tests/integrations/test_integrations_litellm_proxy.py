"""A real LiteLLM proxy process in front of the local provider, with the budget hook named
in its config: a request carrying a token under a $0.05 root is budgeted (charged what the
provider's usage costs), refused at the ceiling with HTTP 402 and an OpenAI-shaped error, and the
refused request never reaches the provider; a request without the header passes."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator import Coordinator, ExecutionConfig, ExecutionContext
from coordinator.core import pricing
from coordinator.core.amounts import usd_to_micro
from tests.support.fake_provider import ProviderServer
from tests.support.invariants import check_tree
from tests.support.litellm_proxy import MASTER_KEY, litellm_proxy

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
CONFIG, CLIENT = re.findall(r"```text\n(.*?)```", DOC.read_text(), flags=re.S)[-2:]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    s = ProviderServer()
    yield s
    s.stop()


@pytest.fixture
def proxy(server: ProviderServer, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """``litellm --config`` on a free port, the hook's coordinator on the test's Redis."""
    with litellm_proxy(CONFIG, server, redis_url, tmp_path) as url:
        yield url


def _chat(url: str, headers: dict[str, str], **extra: Any) -> tuple[int, Any]:
    body = json.dumps({"model": "gpt-4", "messages": MESSAGES, "max_tokens": 50, **extra})
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body.encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {MASTER_KEY}", **headers},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            if extra.get("stream"):  # the events' data lines, [DONE] left out
                return response.status, [json.loads(line[6:]) for line in raw.splitlines()
                                         if line.startswith(b"data: {")]
            return response.status, json.loads(raw)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_proxy_enforces_the_ceiling_of_the_header(coord: Coordinator,
                                                     server: ProviderServer,
                                                     proxy: str) -> None:
    status, _ = _chat(proxy, {})  # no header: passes, budgeted by nobody
    assert status == 200
    before = len(server.provider.stats())
    with ExecutionContext(ExecutionConfig(max_cost_usd=0.05, max_steps=100,
                                          max_retries_total=3)) as root:
        header = {"budget-context": root.token}
        # a stream through the proxy is metered chunk by chunk and charged its usage
        status, events = _chat(proxy, header, stream=True,
                               stream_options={"include_usage": True})
        assert status == 200 and "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events
            if e.get("choices")) == "abcd" * 20
        coord.store.flush()
        streamed = server.provider.stats()[-1]
        assert root.get_snapshot().cost_usd_accumulated == pytest.approx(pricing.price_usd(
            "gpt-4", streamed["prompt_tokens"], streamed["completion_tokens"]))
        calls = 1
        while True:
            status, body = _chat(proxy, header)
            if status != 200:
                break
            assert body["choices"][0]["message"]["content"] == "abcd" * 20
            calls += 1
            assert calls < 50
        assert status == 402, body
        assert body["error"]["type"] == "budget_exceeded"
        assert body["error"]["param"] == root.chain_id
        coord.store.flush()
        snap = root.get_snapshot()
    served = server.provider.stats()[before:]
    assert calls >= 2 and len(served) == calls  # the refused request never reached it
    used = check_tree(coord.client, root.chain_id)
    assert used == usd_to_micro(snap.cost_usd_accumulated) <= 50_000
    assert used == sum(usd_to_micro(pricing.price_usd("gpt-4", s["prompt_tokens"],
                                                      s["completion_tokens"]) or 0)
                       for s in served)


def test_the_documented_client_is_refused_at_the_ceiling(
        coord: Coordinator, server: ProviderServer, proxy: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert "budget_hook" in CONFIG and "budget-context" in CLIENT
    monkeypatch.setenv("LITELLM_PROXY_URL", proxy)
    monkeypatch.setenv("LITELLM_MASTER_KEY", MASTER_KEY)
    namespace: dict[str, Any] = {}
    exec(compile(CLIENT, "docs/integrations.md (LiteLLM proxy client)", "exec"), namespace)  # noqa: S102
    namespace["proxy"].close()
    assert capsys.readouterr().out.splitlines() == ["402 budget_exceeded"]
    assert len(server.provider.stats()) >= 2
