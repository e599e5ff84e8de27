"""docs/degrade.md's examples run as written, in page order, with the SDKs pointed at the
local provider (tests/support/fake_provider.py) through their own environment variables,
and print what the page says they print."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator import Coordinator
from tests.support.fake_provider import ProviderServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "degrade.md"


@pytest.fixture
def provider_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderServer]:
    server = ProviderServer()
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    yield server
    server.stop()


def test_doc_examples_run_and_print_what_the_page_says(
        coord: Coordinator, provider_env: ProviderServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {}
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/degrade.md block {i}", "exec"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["5 23", "final_reserve None", "ALLOW gpt-4o-mini", "24"]
    assert lines[4:7] == ["gpt-4o-mini", "final_reserve None", "gpt-4o"]
    assert lines[7:9] == ["final_reserve", "True"]
    assert lines[9] == "[('usd', 0.5, 0.05), ('usd', 0.8, 0.02)]"
    assert lines[10].startswith("['spend reached 50% of max_cost_usd")
    assert lines[11] == "0.1"
    served = [s["model"] for s in provider_env.provider.stats()]
    # the refused requests were never sent; the final ones went out on what was asked
    assert served[0] == "gpt-4o-mini" and served[1] == "gpt-4o"
    namespace["client"].close()  # type: ignore[attr-defined]
