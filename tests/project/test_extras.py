"""Every extra installs what its documented example imports: each Python block of
docs/integrations.md that imports a third-party module (itself, or through the
``coordinator.integrations`` modules it imports) names its extras in a
``# pip install "budget-coordinator[...]"`` line, and every such module comes with those
extras (their requirements, followed through the installed distributions)."""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # `build` (the test extra) brings tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
INTEGRATIONS = ROOT / "coordinator" / "integrations"
EXTRAS_LINE = re.compile(r'^# pip install "budget-coordinator\[([\w,-]+)\]"', re.M)
OWN = ("coordinator", "worker")


def imported(tree: ast.AST) -> set[str]:
    """Absolute modules a source imports (``from a import b``: ``a``, and ``a.b`` when
    ``a`` is one of the project's packages, whose submodule ``b`` may be)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            if node.module.split(".")[0] in OWN:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def integration_file(module: str) -> Path | None:
    """The file of a ``coordinator.integrations`` module, or None."""
    parts = module.split(".")
    if parts[:2] != ["coordinator", "integrations"] or len(parts) > 3:
        return None
    base = INTEGRATIONS.joinpath(*parts[2:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def third_party(source: str) -> set[str]:
    """Third-party modules the source imports, those of the integration modules it
    imports (and theirs, relative imports followed) included."""
    modules = imported(ast.parse(source))
    seen: set[Path] = set()
    queue = [p for m in modules if (p := integration_file(m)) is not None]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        tree = ast.parse(path.read_text())
        modules |= imported(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                for name in [node.module] if node.module else [a.name for a in node.names]:
                    for candidate in (INTEGRATIONS / f"{name}.py",
                                      INTEGRATIONS / name / "__init__.py"):
                        if candidate.is_file():
                            queue.append(candidate)
    return {m for m in modules
            if m.split(".")[0] not in (*OWN, *sys.stdlib_module_names)}


@cache
def top_level() -> dict[str, list[str]]:
    return metadata.packages_distributions()


@cache
def files_of(dist: str) -> tuple[str, ...]:
    return tuple(str(f) for f in metadata.distribution(dist).files or ())


def providers(module: str) -> set[str]:
    """The installed distributions that provide ``module`` (the one holding its files
    when several share its top-level name, as ``opentelemetry-*`` do)."""
    dists = top_level().get(module.split(".")[0], [])
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = "/".join(parts[:depth])
        holding = {d for d in dists
                   if any(f.startswith(prefix + "/") or f == prefix + ".py"
                          for f in files_of(d))}
        if holding:
            return {canonicalize_name(d) for d in holding}
    return {canonicalize_name(d) for d in dists}


@cache
def requirements_of(dist: str, extras: frozenset[str]) -> frozenset[Requirement]:
    """An installed distribution's requirements, with the given extras."""
    try:
        listed = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return frozenset()
    out = set()
    for line in listed:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e})
                                     for e in extras | {""}):
            out.add(req)
    return frozenset(out)


def installed_with(extras: list[str]) -> set[str]:
    """Every distribution ``pip install "budget-coordinator[extras]"`` installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return closure(wanted)


def closure(wanted: list[Requirement]) -> set[str]:
    """The distributions these requirements install (theirs followed)."""
    queue = list(wanted)
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        req = queue.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        queue += requirements_of(*key)
    return {name for name, _ in seen}


def python_blocks() -> list[tuple[int, str]]:
    text = DOC.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S)]


def test_every_documented_example_imports_only_what_its_extras_install() -> None:
    problems: list[str] = []
    for line, block in python_blocks():
        modules = third_party(block)
        named = EXTRAS_LINE.search(block)
        if not modules:
            continue
        if named is None:
            problems.append(f"integrations.md:{line} imports {sorted(modules)} and names no "
                            f"extra")
            continue
        extras = named.group(1).split(",")
        installed = installed_with(extras)
        for module in sorted(modules):
            dists = providers(module)
            if not dists:
                problems.append(f"integrations.md:{line}: {module} is not installed here")
            elif not dists & installed:
                problems.append(f"integrations.md:{line}: {module} ({', '.join(sorted(dists))}) "
                                f"is not installed by [{','.join(extras)}]")
    assert problems == []


def test_the_check_finds_an_import_its_extra_does_not_install() -> None:
    assert "langgraph" in providers("langgraph.graph")
    assert "langgraph" not in installed_with(["openai"])
    assert providers("opentelemetry.sdk.trace") == {"opentelemetry-sdk"}
    assert third_party("from coordinator.integrations import litellm as x\n") >= {"litellm"}
