"""docs/quotas.md's example and the README's quota section run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator import Coordinator
from coordinator.quotas import Quotas

ROOT = Path(__file__).resolve().parents[2]


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_doc_example_runs(coord: Coordinator, capsys: pytest.CaptureFixture[str]) -> None:
    example = _blocks(ROOT / "docs" / "quotas.md")[0]
    exec(compile(example, "docs/quotas.md", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out.strip() == "['ALLOW', 'ALLOW', 'ALLOW', 'HALT'] None"


def test_readme_quota_section_runs(coord: Coordinator) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quotas (standing budgets)")[1]
    [block] = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], flags=re.S)
    assert len(block.strip().splitlines()) == 5
    exec(compile(block, "README quotas", "exec"), {})  # noqa: S102
    rules = {r.id: r for r in Quotas(coord).rules()}
    assert rules["research-day"].limits == {"usd": 500_000_000}
    assert rules["each-user"].tz == "Europe/Paris"
