"""The package's layering, read from its source with ast: no import cycles (imports inside
functions and under TYPE_CHECKING count too), ``redis`` imported only by the Redis layer,
the pure core importing nothing with I/O, Celery imported only by the Celery integration
(``coordinator.celery``) and the demo, and the ``worker`` name imported by no module of
the package."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "worker")

REDIS_LAYER = ("coordinator.store",)
"""The only modules that may import ``redis`` (or ``hiredis``)."""
REDIS_EXCEPTIONS = ("coordinator.demo",)
"""The one documented exception: the demo pings a Redis before it starts and clears its
Celery queue's broker keys when it ends. budgetctl (coordinator/cli/) is not one: its
reads go through coordinator/store/views.py and its errors come from store/errors.py."""
CELERY_CORNERS = ("coordinator.celery", "coordinator.demo")
"""The only modules of coordinator/ that may import celery or kombu: the Celery
integration, and the demo, whose tasks run on Celery workers (``budgetctl demo`` imports
it only when it runs)."""
OUTER = {"coordinator.cli": ("coordinator.cli",),
         "coordinator.demo": ("coordinator.demo", "coordinator.cli"),
         "coordinator.celery": ("coordinator.celery", "coordinator.demo")}
"""The outer corner no other layer imports: budgetctl (only itself), the demo (only
itself and budgetctl, whose ``demo`` command runs it), and the Celery integration (only
itself and the demo's tasks)."""
CORE_ALLOWED = ("coordinator.core", "coordinator.errors", "coordinator.models")
"""What the pure core may import from the package."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") or name.startswith(p + "_")
               for p in prefixes)


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the module, relative
    ones resolved; ``from X import y`` yields ``X.y`` when that is a module."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yielded = False
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub, node.lineno
                    yielded = True
            if not yielded:
                yield target, node.lineno


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Edges between the packages' own modules, and every import as (from, to, line)."""
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    every: list[tuple[str, str, int]] = []
    for name, path in known.items():
        for target, line in imports(name, path, known):
            every.append((name, target, line))
            if target in known and target != name:
                edges[name].add(target)
    return edges, every


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_there_is_no_import_cycle() -> None:
    edges, _ = graph()
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_only_the_redis_layer_imports_redis() -> None:
    _, every = graph()
    offenders = [(src, dst, line) for src, dst, line in every
                 if dst.split(".")[0] in ("redis", "hiredis")
                 and not under(src, REDIS_LAYER + REDIS_EXCEPTIONS)]
    assert offenders == []


def test_no_layer_imports_the_cli_the_demo_or_the_celery_integration() -> None:
    _, every = graph()
    offenders = [(src, dst, line) for src, dst, line in every
                 for outer, allowed in OUTER.items()
                 if under(dst, (outer,)) and src.startswith("coordinator")
                 and not under(src, allowed)]
    assert offenders == []


def test_the_core_never_imports_celery() -> None:
    _, every = graph()
    offenders = [(src, dst, line) for src, dst, line in every
                 if src.startswith("coordinator") and not under(src, CELERY_CORNERS)
                 and dst.split(".")[0] in ("celery", "kombu")]
    assert offenders == []


def test_no_module_of_the_package_imports_the_worker_name() -> None:
    """``worker`` is a name a project's own ``worker.py`` shadows: the package reaches its
    Celery integration as ``coordinator.celery`` only."""
    _, every = graph()
    assert [(src, dst, line) for src, dst, line in every
            if src.startswith("coordinator") and dst.split(".")[0] == "worker"] == []


def test_the_pure_core_imports_no_other_layer_and_no_io_library() -> None:
    _, every = graph()
    offenders = [(src, dst, line) for src, dst, line in every
                 if src.startswith("coordinator.core")
                 and ((dst.startswith("coordinator") and not under(dst, CORE_ALLOWED))
                      or dst.split(".")[0] in ("redis", "hiredis", "socket", "subprocess",
                                               "celery", "httpx", "requests"))]
    assert offenders == []


def test_the_package_root_is_imported_by_no_module_inside_it() -> None:
    """``coordinator/__init__.py`` imports the whole public API: a module importing it back
    would close a cycle through it."""
    _, every = graph()
    assert [(src, line) for src, dst, line in every
            if dst == "coordinator" and src.startswith("coordinator.")] == []


def test_constants_shared_with_lua_are_defined_once_in_python() -> None:
    """The scripts read HOOK and EVENT_STREAM_CAP from the prelude rendered from
    coordinator/core/script_constants.py, and never repeat their values."""
    from coordinator.core.script_constants import EVENT_STREAM_CAP, HOOK
    from coordinator.store.scripts import SCRIPT_NAMES, lua_dir, prelude, script_source

    assert f"local HOOK = '{HOOK}'" in prelude()
    assert f"local EVENT_STREAM_CAP = {EVENT_STREAM_CAP}" in prelude()
    for lua in sorted(lua_dir().rglob("*.lua")):
        text = lua.read_text()
        assert f"'{HOOK}'" not in text, lua.name
        assert not re.search(rf"\b{EVENT_STREAM_CAP}\b", text), lua.name
    assert all(script_source(name).startswith(prelude().splitlines()[0])
               for name in SCRIPT_NAMES)
