"""The layering rules, read from the source: what each stage may import.

- ``conformance/`` runs inside the images: it imports only the standard
  library, torch, xformers and diffusers (an import inside a ``try`` that
  catches its failure is optional, not needed).
- ``lockfile/``'s readers (what ``query``, ``export`` and the site load)
  need no uv, no Docker SDK and no network: importing them loads none.
- ``commands/`` is the top: nothing below imports it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "envbuilder"
SUITE_MAY_IMPORT = frozenset({"torch", "xformers", "diffusers"})
READERS = ("read", "query", "export", "model", "canonical", "gpus", "verdicts")
NOT_FOR_READERS = frozenset(
    {"uv", "docker", "requests", "urllib3", "cachecontrol", "http", "socket", "urllib.request"}
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _catches_import_errors(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in node.handlers:
        if handler.type is None:
            return True
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(t, ast.Name) and t.id in names for t in caught):
            return True
    return False


def _imports(module: str, *, at_import_time: bool) -> Iterator[tuple[str, bool]]:
    """(imported module, optional) for every import of ``module``; with
    ``at_import_time``, only those that run when the module is imported."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, optional: bool) -> Iterator[tuple[str, bool]]:
        if at_import_time and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            yield from ((a.name, optional) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield name, optional
            for alias in node.names:
                if f"{name}.{alias.name}" in MODULES:
                    yield f"{name}.{alias.name}", optional
        if isinstance(node, ast.Try) and _catches_import_errors(node):
            for child in node.body:
                yield from visit(child, True)
            rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
            for part in rest:
                yield from visit(part, optional)
            return
        for inner in ast.iter_child_nodes(node):
            yield from visit(inner, optional)

    yield from visit(ast.parse(path.read_text(encoding="utf-8")), False)


def _loaded_by(module: str) -> set[str]:
    """Every module importing ``module`` loads, ours followed through, others by name."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in MODULES:
            parts = current.split(".")
            todo += [
                ".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES
            ]
            todo += [name for name, _ in _imports(current, at_import_time=True)]
    return seen


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if m.startswith("envbuilder.conformance"))
)
def test_the_suite_imports_only_the_standard_library_torch_xformers_and_diffusers(
    module: str,
) -> None:
    needed = {
        name
        for name, optional in _imports(module, at_import_time=False)
        if not optional
        and not name.startswith("envbuilder.conformance")
        and name != "envbuilder"  # the package root: a docstring and __version__
        and name.split(".")[0] not in sys.stdlib_module_names | SUITE_MAY_IMPORT | {"__future__"}
    }
    assert needed == set()


@pytest.mark.parametrize("reader", READERS)
def test_lockfile_readers_load_no_uv_docker_or_network(reader: str) -> None:
    loaded = _loaded_by(f"envbuilder.lockfile.{reader}")
    ours = {m for m in loaded if m.startswith(("envbuilder.index", "envbuilder.docker"))}
    theirs = {m for m in loaded if m in NOT_FOR_READERS or m.split(".")[0] in NOT_FOR_READERS}
    assert (ours, theirs) == (set(), set())


@pytest.mark.parametrize(
    "module",
    sorted(m for m in MODULES if not m.startswith(("envbuilder.commands", "envbuilder.cli"))),
)
def test_nothing_below_the_commands_imports_them(module: str) -> None:
    upward = {
        name
        for name, _ in _imports(module, at_import_time=False)
        if name.startswith("envbuilder.commands")
    }
    assert upward == set()
