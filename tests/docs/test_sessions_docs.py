"""docs/sessions.md's examples run as written, against a real Redis and real kernels."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

from coordinator import Coordinator

DOC = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"


def test_doc_examples_run(coord: Coordinator, capsys: pytest.CaptureFixture[str],
                          short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = short_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the kernels' folders
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    first, example = blocks[0], blocks[-1]
    exec(compile(first + "\nsessions.close()\n", "docs block 0", "exec"), {})  # noqa: S102
    exec(compile(example, "docs worked example", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out.split()
    assert out == ["1.4142135623730951", "0.21", "False", "2", "terminated", "5"]
    assert [p.name for p in tmp_path.iterdir()] == [f"budget-sessions-{os.getuid()}"]
    assert not any((tmp_path / f"budget-sessions-{os.getuid()}").iterdir())  # all closed
