"""``./dev demo`` installs what the demo imports and nothing more; ``./dev test`` the test
extra. What the demo imports: the third-party modules its own modules import anywhere,
those the package's modules it loads import at their top (an import guarded by
``except ImportError``, or made inside a function, is not needed to run it), and those
its Celery broker's transport (Redis) loads."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tests.project.test_extras import closure, installed_with, providers

ROOT = Path(__file__).resolve().parents[2]
DEMO = ("coordinator.cli.demo", "coordinator.demo")


def extras_of(command: str) -> list[str]:
    """The extras ``./dev <command>`` installs the project with."""
    found = re.search(rf"^\s*{command}\)\s+setup_for ([\w,-]+)\b", (ROOT / "dev").read_text(),
                      flags=re.M)
    assert found, f"./dev {command} names no setup_for"
    return found.group(1).split(",")


def loaded_by_the_demo() -> tuple[list[str], list[str]]:
    """The package's modules loaded with the demo's, as ``budgetctl demo`` loads them; the
    top-level modules its broker's transport loads besides."""
    code = ("import sys\n"
            "import coordinator.cli, coordinator.demo.infra, coordinator.demo.scenarios\n"
            "import coordinator.demo.tasks, coordinator.cli.demo\n"
            "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'coordinator'))\n"
            "before = {m.split('.')[0] for m in sys.modules}\n"
            "assert coordinator.demo.tasks.app.connection_for_write().transport\n"
            "print(' '.join({m.split('.')[0] for m in sys.modules} - before))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**os.environ, "BUDGET_DEMO_BROKER": "redis://127.0.0.1:9/0"})
    package, transport = done.stdout.splitlines()
    return package.split(), transport.split()


def _guarded(tree: ast.AST) -> set[int]:
    """The import statements inside a ``try`` that catches ImportError."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and any(isinstance(n, ast.Name) and n.id in (
                    "ImportError", "ModuleNotFoundError") for n in ast.walk(h.type))
                for h in node.handlers):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(tree: ast.AST, anywhere: bool) -> list[ast.Import | ast.ImportFrom]:
    """Import statements: all of them, or those outside functions."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        for child in ast.iter_child_nodes(todo.pop()):
            if not anywhere and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            todo.append(child)
    return found


def needed_by_the_demo() -> set[str]:
    """The distributions whose modules the demo needs."""
    package, transport = loaded_by_the_demo()
    tops = set(transport)
    for name in package:
        base = ROOT.joinpath(*name.split("."))
        path = base / "__init__.py" if (base / "__init__.py").is_file() else \
            base.with_suffix(".py")
        tree = ast.parse(path.read_text())
        guarded = _guarded(tree)
        for node in _imports(tree, anywhere=name.startswith(DEMO)):
            if id(node) in guarded or (isinstance(node, ast.ImportFrom) and node.level):
                continue
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names]
            tops |= {n.split(".")[0] for n in names}
    tops -= {"coordinator", "worker", *sys.stdlib_module_names}
    return {dist for top in tops for dist in providers(top)}


def test_dev_demo_installs_what_the_demo_imports_and_nothing_more() -> None:
    needed = needed_by_the_demo()
    assert "celery" in needed
    installed = installed_with(extras_of("demo"))
    assert needed <= installed, sorted(needed - installed)
    project_deps = installed_with([])
    assert installed == project_deps | closure([Requirement(d) for d in needed]), \
        sorted(installed - project_deps - closure([Requirement(d) for d in needed]))


def test_dev_test_installs_the_test_extra() -> None:
    assert extras_of("test") == ["test"]
