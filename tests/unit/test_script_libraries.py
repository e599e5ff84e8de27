"""Each script carries the libraries its header lists (``-- uses:``, lua/lib/), joined by
the loader in the order they need each other (``-- needs:``): what it carries is enough
(every function called in its registered source is defined there) and no more (each
library it carries is called by the script or by another library it carries). No Redis
needed."""

from __future__ import annotations

import re

import pytest

from coordinator.store import sessions
from coordinator.store.scripts import (
    SCRIPT_NAMES,
    declared,
    library_order,
    lua_dir,
    script_source,
)

SCRIPTS = sorted((*SCRIPT_NAMES, *sessions.SCRIPT_NAMES))
BUILTINS = {"redis", "cjson", "type", "tonumber", "tostring", "pairs", "ipairs", "next",
            "unpack", "pcall", "error", "select", "assert", "string", "table", "math"}
KEYWORDS = {"and", "or", "not", "if", "elseif", "while", "until", "return", "function",
            "in", "local", "then", "do"}
_STRING = re.compile(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"")


def code(text: str) -> str:
    """Lua source without its comments and string literals."""
    return "\n".join(_STRING.sub("''", line).split("--", 1)[0] for line in text.splitlines())


def defined(source: str) -> set[str]:
    """Names a source declares: locals, local functions, parameters."""
    names = set(re.findall(r"\blocal\s+function\s+(\w+)", source))
    for group in re.findall(r"\blocal\s+([\w\s,]+?)\s*(?:=|\n|$)", source, re.M):
        names.update(n.strip() for n in group.split(","))
    for params in re.findall(r"\bfunction\b[\w\s.:]*\(([^)]*)\)", source):
        names.update(p.strip() for p in params.split(",") if p.strip())
    for loop in re.findall(r"\bfor\s+([\w\s,]+?)\s*(?:=|\bin\b)", source):
        names.update(n.strip() for n in loop.split(","))
    return names


def called(source: str) -> set[str]:
    """Names a source calls as functions (not fields or methods)."""
    return set(re.findall(r"(?<![.:\w])([A-Za-z_]\w*)\s*\(", source)) - KEYWORDS


def library(name: str) -> str:
    return (lua_dir() / "lib" / f"{name}.lua").read_text()


def uses(script: str) -> list[str]:
    return declared((lua_dir() / f"{script}.lua").read_text(), "uses")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_carries_every_function_it_calls(script: str) -> None:
    source = code(script_source(script))
    assert called(source) - defined(source) - BUILTINS == set()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_carries_only_libraries_it_calls(script: str) -> None:
    carried = uses(script)
    for name in carried:
        own = {n for n in defined(code(library(name))) if re.search(
            rf"^local (?:function )?{n}\b", library(name), re.M)}
        callers = [code((lua_dir() / f"{script}.lua").read_text()),
                   *(code(library(other)) for other in carried if other != name)]
        assert any(own & called(c) or any(re.search(rf"\b{n}\b", c) for n in own)
                   for c in callers), f"{script}.lua carries {name} without using it"


def test_the_loader_orders_libraries_by_their_needs_and_refuses_a_missing_one() -> None:
    assert library_order(["finish", "warnings", "quota", "ledger", "levels", "stops",
                          "common", "numbers"]) == ["numbers", "common", "stops", "levels",
                                                    "ledger", "quota", "warnings", "finish"]
    with pytest.raises(ValueError, match="needs numbers"):
        library_order(["levels"])


def test_every_library_is_carried_by_some_script() -> None:
    libraries = {p.stem for p in (lua_dir() / "lib").glob("*.lua")}
    assert libraries == {name for script in SCRIPTS for name in uses(script)}
