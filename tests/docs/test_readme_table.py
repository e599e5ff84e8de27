"""The README's performance table is the output of bench/readme_table.py (a benchmark
run), never hand-copied: its text has exactly the script's format, whatever the numbers."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_table_script() -> object:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("readme_table",
                                                      REPO / "bench" / "readme_table.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_the_readme_performance_table_has_the_format_the_script_prints() -> None:
    script = load_table_script()
    hole = "\x00"
    template = script.render({name: hole for name in script.FIELDS})  # type: ignore[attr-defined]
    value = r"[0-9A-Za-z][^|\n]*?"  # a figure, a date, the machine's description
    pattern = re.escape(template).replace(re.escape(hole), value)
    readme = (REPO / "README.md").read_text()
    assert readme.count(script.BEGIN) == 1, "the README has no generated table"  # type: ignore[attr-defined]
    assert re.search(pattern, readme), \
        "README.md's table is not bench/readme_table.py's output: regenerate it with " \
        "`.venv/bin/python bench/readme_table.py --write README.md`"


def test_a_hand_edited_table_is_caught() -> None:
    script = load_table_script()
    filled = script.render({name: "1.23" for name in script.FIELDS})  # type: ignore[attr-defined]
    edited = filled.replace("≤ 1.7 (goal 1.3)", "≤ 1.5")
    template = script.render({name: "\x00" for name in script.FIELDS})  # type: ignore[attr-defined]
    pattern = re.escape(template).replace(re.escape("\x00"), r"[0-9A-Za-z][^|\n]*?")
    assert re.search(pattern, filled)
    assert not re.search(pattern, edited)
