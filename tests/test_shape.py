"""The package's shape: vendor SQL in the store, no import cycles, no late imports.

These read the source, not the database: a failure names the module that
branched on the vendor or closed an import cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_intents"
# Modules that may ask which database they run on: the store, and Django's
# per-vendor DDL in the migrations.
VENDOR_AWARE = ("store/", "migrations/")
# Function-level imports of the package that are there on purpose: an
# AppConfig imports its checks and receivers in ready(), once models are loaded.
LATE_IMPORTS_ALLOWED = {("apps.py", "ready")}
# The one import cycle allowed: the model names its manager, and the manager
# names the model it returns (under TYPE_CHECKING), as Django's own do.
CYCLE_ALLOWED = {("django_intents.managers", "django_intents.models")}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package modules an import statement names (``from . import x`` names ``x`` too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("django_intents")]
    if node.level == 0:
        base = node.module or ""
    else:
        package = name_of(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([node.module] if node.module else [])])
    if not base.startswith("django_intents"):
        return []
    names = [base]
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or (
            PACKAGE.parent / candidate.replace(".", "/") / "__init__.py"
        ).exists():
            names.append(candidate)
    return names


def top_level_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports at module level, ``TYPE_CHECKING`` blocks included:
    a type a module needs from one that imports it is a cycle too."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(resolve(path, node))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found - {name_of(path)}


def test_only_the_store_branches_on_the_database_vendor():
    decision = re.compile(r"\bvendor\s*(==|!=|\bin\b|\bnot in\b)")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in modules()
        if not str(path.relative_to(PACKAGE)).startswith(VENDOR_AWARE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if decision.search(line)
    ]
    assert not offenders, "\n".join(offenders)


def test_no_import_cycle_inside_the_package():
    graph = {
        (name := name_of(path)): {
            target for target in top_level_imports(path) if (name, target) not in CYCLE_ALLOWED
        }
        for path in modules()
    }
    done: set[str] = set()

    def walk(node: str, stack: list[str]) -> None:
        if node in stack:
            cycle = " -> ".join(stack[stack.index(node) :] + [node])
            pytest.fail(f"import cycle: {cycle}")
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            walk(target, [*stack, node])
        done.add(node)

    for module in sorted(graph):
        walk(module, [])


def test_no_function_level_import_of_the_package():
    late = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    for target in resolve(path, inner):
                        if (path.name, node.name) not in LATE_IMPORTS_ALLOWED:
                            late.append(
                                f"{path.relative_to(PACKAGE)}: {node.name} imports {target}"
                            )
    assert not late, "\n".join(sorted(set(late)))
