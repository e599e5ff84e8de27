"""docs/integrations.md's examples run as written, with the SDKs pointed at the local
provider (tests/support/fake_provider.py) through their own environment variables."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.util._once import Once

from coordinator import Coordinator
from tests.support.fake_provider import ProviderServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


@pytest.fixture
def provider_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderServer]:
    server = ProviderServer()
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # its traces would go out
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price fetch at import
    yield server
    server.stop()
    trace._TRACER_PROVIDER = None  # the doc's last example sets a tracer provider
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.mark.filterwarnings("ignore:Item.*ReadOnly.*:UserWarning")  # LiteLLM's models
def test_doc_examples_run(coord: Coordinator, provider_env: ProviderServer,
                          capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {}
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", DOC.read_text(),
                                         flags=re.S)):
        exec(compile(block, f"docs/integrations.md block {i}", "exec"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    served = provider_env.provider.stats()
    # the first two requests were served and charged; the third was refused unsent
    assert lines[1:3] == ["budget_exceeded", "2"]
    assert float(lines[0]) > 0 and float(lines[3]) > 0  # the pydantic-ai run's spend
    assert lines[4:] == ["sunny in Porto", "weather", "True", "chat gpt-4o ALLOW"]
    # one line: 2 + async: 2 + pydantic-ai: 2 + graph: 1 + agents: 3 + litellm: 1 +
    # telemetry: 1
    assert len(served) == 12
    namespace["client"].close()  # type: ignore[attr-defined]
