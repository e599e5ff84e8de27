"""The wheel ships the Lua scripts, and the installed package loads them from inside."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coordinator.store.scripts import SCRIPT_NAMES, lua_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_every_lua_script(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in (*SCRIPT_NAMES, "lib/numbers"):
        assert f"coordinator/lua/{script}.lua" in names, script
    for lua in (ROOT / "lua").rglob("*.lua"):
        assert f"coordinator/lua/{lua.relative_to(ROOT / 'lua').as_posix()}" in names
    assert "coordinator/py.typed" in names
    assert any(n.startswith("worker/") for n in names)


def test_every_script_opens_with_its_contract() -> None:
    for lua in sorted(lua_dir().glob("*.lua")):  # tests/unit/test_contracts.py reads each slot
        head = lua.read_text().splitlines()[:3]
        assert head[0].startswith(f"-- {lua.name}:"), lua.name
        text = lua.read_text()
        assert "KEYS[1" in text and "Returns" in text and "-- uses:" in text, lua.name


def test_every_library_opens_with_what_it_holds_and_needs() -> None:
    for lua in sorted((lua_dir() / "lib").glob("*.lua")):
        text = lua.read_text()
        assert text.startswith(f"-- {lua.name}:") and "-- needs:" in text, lua.name
