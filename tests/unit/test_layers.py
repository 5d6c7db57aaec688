"""The layering rules, read from the source: what each stage may import.

- ``conformance/`` runs inside the images: it imports only the standard
  library, torch, xformers and diffusers (an import inside a ``try`` that
  catches its failure is optional, not needed).
- the lockfile's readers (what ``query``, ``export`` and the site load)
  need no uv, no Docker SDK and no network: importing them loads none.
- ``commands/`` is the top: nothing below imports it.
- The stages import down the pipeline, never sideways or back (`STAGE_RULES`):
  ``lockfile/`` reads records, not the resolver, Docker or the index (and of the
  suite only its stdlib record module, the home of the check vocabulary);
  ``ghmatrix`` plans jobs without Docker; ``index/`` serves the resolver and
  knows nothing of it; ``resolve/`` comes before the lockfile and imports none of
  it (the GPU table is the ground floor's, ``envbuilder.gpus``); the lockfile
  imports no command. Making the lockfile (``aggregate/``) and using it
  (``consumer/``) sit above the document and beside each other: nothing below
  them imports either, and neither imports the other. Each rule is seen
  rejecting an injected import.
- The import graph has no cycles, module by module (the imports that run when a
  module is imported) and stage by stage (every import, grouped by the package
  under ``envbuilder``); a planted cycle is seen found.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "envbuilder"
SUITE_MAY_IMPORT = frozenset({"torch", "xformers", "diffusers"})
READERS = (
    "lockfile.read",
    "consumer.query",
    "consumer.export",
    "lockfile.model",
    "lockfile.evidence",
    "lockfile.canonical",
    "lockfile.gpus",
    "lockfile.verdicts",
)
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
    tree = ast.parse(path.read_text(encoding="utf-8"))
    yield from _imports_of(
        tree, module, is_package=path.name == "__init__.py", at_import_time=at_import_time
    )


def _imports_of(
    tree: ast.AST, module: str, *, is_package: bool, at_import_time: bool
) -> Iterator[tuple[str, bool]]:
    """`_imports` of a parsed module: ``from package import submodule`` names the
    submodule (and the package only when a name taken from it is not a module)."""
    package = module if is_package else module.rpartition(".")[0]

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
            submodules = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES]
            if len(submodules) < len(node.names):
                yield name, optional
            yield from ((m, optional) for m in submodules)
        if isinstance(node, ast.Try) and _catches_import_errors(node):
            for child in node.body:
                yield from visit(child, True)
            rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
            for part in rest:
                yield from visit(part, optional)
            return
        for inner in ast.iter_child_nodes(node):
            yield from visit(inner, optional)

    yield from visit(tree, False)


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
    loaded = _loaded_by(f"envbuilder.{reader}")
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


@dataclass(frozen=True)
class StageRule:
    """Modules under ``importer`` import nothing under ``forbidden`` but ``allowed``."""

    importer: str
    forbidden: str
    allowed: frozenset[str] = frozenset()
    why: str = ""

    def applies_to(self, module: str) -> bool:
        return _under(module, self.importer)

    def rejects(self, imported: str) -> bool:
        return _under(imported, self.forbidden) and imported not in self.allowed


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


STAGE_RULES: tuple[StageRule, ...] = (
    StageRule("envbuilder.lockfile", "envbuilder.resolve", why="it reads resolution.json"),
    StageRule("envbuilder.lockfile", "envbuilder.docker", why="a host has no Docker"),
    StageRule("envbuilder.lockfile", "envbuilder.index", why="its readers need no network"),
    StageRule(
        "envbuilder.lockfile",
        "envbuilder.conformance",
        allowed=frozenset({"envbuilder.conformance._record"}),
        why="only the suite's check vocabulary",
    ),
    StageRule(
        "envbuilder.lockfile", "envbuilder.commands", why="the commands are the top: they use it"
    ),
    StageRule(
        "envbuilder.resolve",
        "envbuilder.lockfile",
        why="the lockfile is made from what the resolver writes; GPUs are envbuilder.gpus",
    ),
    # the lockfile's making (aggregate) and its use (consumer) sit above the document and
    # everything the pipeline makes before it, and beside each other
    *(
        StageRule(below, above, why="it comes before the lockfile is made or used")
        for below in (
            "envbuilder.lockfile",
            "envbuilder.resolve",
            "envbuilder.docker",
            "envbuilder.sourcebuild",
            "envbuilder.index",
        )
        for above in ("envbuilder.aggregate", "envbuilder.consumer")
    ),
    StageRule(
        "envbuilder.aggregate",
        "envbuilder.consumer",
        why="making the lockfile needs nothing of a user's machine; shared rules are lockfile/'s",
    ),
    StageRule(
        "envbuilder.consumer",
        "envbuilder.aggregate",
        why="a user's machine reads the lockfile, never makes it; shared rules are lockfile/'s",
    ),
    StageRule("envbuilder.ghmatrix", "envbuilder.docker", why="it plans jobs, builds nothing"),
    StageRule("envbuilder.index", "envbuilder.resolve", why="the resolver uses the index"),
    StageRule(
        "envbuilder.docker",
        "envbuilder.sourcebuild",
        why="the source builder runs in its containers; a built wheel comes in the request",
    ),
    StageRule(
        "envbuilder.sourcebuild",
        "envbuilder.lockfile",
        why="the lockfile records its builds; build records are read where they are made",
    ),
)


def broken_rules(module: str, imported: Iterable[str]) -> list[str]:
    """``module -> imported (rule)`` for each import a stage rule forbids."""
    return [
        f"{module} -> {name} ({rule.why})"
        for name in sorted(set(imported))
        for rule in STAGE_RULES
        if rule.applies_to(module) and rule.rejects(name)
    ]


@pytest.mark.parametrize(
    "module",
    sorted(m for m in MODULES if any(rule.applies_to(m) for rule in STAGE_RULES)),
)
def test_stages_import_down_the_pipeline_only(module: str) -> None:
    imported = [name for name, _ in _imports(module, at_import_time=False)]
    assert broken_rules(module, imported) == []


def _injected(module: str, source: str) -> list[str]:
    """The rules broken by a module named ``module`` whose source is ``source``."""
    tree = ast.parse(source)
    imported = [n for n, _ in _imports_of(tree, module, is_package=False, at_import_time=False)]
    return broken_rules(module, imported)


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        # each rule, seen rejecting an import of the kind it forbids (also inside a function)
        (
            "envbuilder.lockfile.fake",
            "from envbuilder.resolve.matrix import load_matrix",
            "envbuilder.resolve.matrix",
        ),
        (
            "envbuilder.lockfile.fake",
            "def f():\n    from envbuilder.docker.plan import library_path",
            "envbuilder.docker.plan",
        ),
        ("envbuilder.lockfile.fake", "import envbuilder.index.http", "envbuilder.index.http"),
        (
            "envbuilder.lockfile.fake",
            "from ..conformance import runner",
            "envbuilder.conformance.runner",
        ),
        (
            "envbuilder.lockfile.fake",
            "from envbuilder.conformance import SUITE_VERSION",
            "envbuilder.conformance",
        ),
        (
            "envbuilder.ghmatrix",
            "from envbuilder.docker.plan import image_tag",
            "envbuilder.docker.plan",
        ),
        (
            "envbuilder.index.fake",
            "from envbuilder.resolve import wheels",
            "envbuilder.resolve.wheels",
        ),
        (
            "envbuilder.docker.fake",
            "def f():\n    from envbuilder.sourcebuild.image import image_wheel",
            "envbuilder.sourcebuild.image",
        ),
        (
            "envbuilder.sourcebuild.fake",
            "from envbuilder.lockfile.sourcebuilds import recorded_wheel",
            "envbuilder.lockfile.sourcebuilds",
        ),
        (
            "envbuilder.lockfile.fake",
            "def f():\n    from envbuilder.commands.query import run",
            "envbuilder.commands.query",
        ),
        (
            "envbuilder.resolve.fake",
            "from envbuilder.lockfile.gpus import GPU_COMPUTE_CAPABILITY",
            "envbuilder.lockfile.gpus",
        ),
        (
            "envbuilder.resolve.matrix.fake",
            "from ...lockfile import model",
            "envbuilder.lockfile.model",
        ),
        (
            "envbuilder.lockfile.fake",
            "def f():\n    from envbuilder.consumer.query import answer",
            "envbuilder.consumer.query",
        ),
        ("envbuilder.lockfile.fake", "from ..aggregate import merge", "envbuilder.aggregate.merge"),
        (
            "envbuilder.resolve.fake",
            "from envbuilder.aggregate.claims import check_claims",
            "envbuilder.aggregate.claims",
        ),
        (
            "envbuilder.sourcebuild.fake",
            "from envbuilder.consumer import published_wheel",
            "envbuilder.consumer.published_wheel",
        ),
        (
            "envbuilder.aggregate.fake",
            "from envbuilder.consumer.host import detect_host",
            "envbuilder.consumer.host",
        ),
        (
            "envbuilder.consumer.fake",
            "def f():\n    from envbuilder.aggregate.results import load_results",
            "envbuilder.aggregate.results",
        ),
        # and letting through what is allowed
        ("envbuilder.aggregate.fake", "from envbuilder.lockfile.model import Run", None),
        ("envbuilder.consumer.fake", "from envbuilder.lockfile.read import load_lockfile", None),
        ("envbuilder.resolve.fake", "from envbuilder.gpus import CudaArch", None),
        ("envbuilder.lockfile.fake", "from envbuilder.gpus import arch_covers", None),
        ("envbuilder.lockfile.fake", "from envbuilder.conformance._record import USES", None),
        ("envbuilder.lockfile.fake", "from envbuilder.conformance import _record", None),
        ("envbuilder.lockfile.fake", "from envbuilder.model import Resolution", None),
        ("envbuilder.ghmatrix", "from envbuilder.model import Combination", None),
        ("envbuilder.resolve.fake", "from envbuilder.index.http import HttpClient", None),
        ("envbuilder.sourcebuild.fake", "from envbuilder.docker.plan import LockedWheel", None),
        ("envbuilder.lockfile.fake", "from envbuilder.sourcebuild.cache import record_name", None),
    ],
)
def test_each_stage_rule_rejects_an_injected_import(
    module: str, source: str, broken: str | None
) -> None:
    got = _injected(module, source)
    assert [line.split(" ")[2] for line in got] == ([broken] if broken else [])


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of *graph* (module -> modules it imports): each strongly connected
    set of two or more, sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def _graph(*, at_import_time: bool) -> dict[str, set[str]]:
    return {
        module: {
            name
            for name, _ in _imports(module, at_import_time=at_import_time)
            if name in MODULES and name != module
        }
        for module in MODULES
    }


def _stage(module: str) -> str:
    """``envbuilder.resolve.matrix.rows`` -> ``envbuilder.resolve``."""
    return ".".join(module.split(".")[:2])


def _stages(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    grouped: dict[str, set[str]] = {}
    for module, imported in graph.items():
        grouped.setdefault(_stage(module), set()).update(
            _stage(name) for name in imported if _stage(name) != _stage(module)
        )
    return grouped


def test_no_module_imports_itself_back_at_import_time() -> None:
    assert cycles(_graph(at_import_time=True)) == []


def test_the_stages_import_each_other_without_cycles() -> None:
    assert cycles(_stages(_graph(at_import_time=False))) == []


@pytest.mark.parametrize(
    ("graph", "found"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        # stage by stage: resolve.x -> lockfile.y and lockfile.z -> resolve.w is one cycle
        (
            _stages(
                {
                    "envbuilder.resolve.x": {"envbuilder.lockfile.y"},
                    "envbuilder.lockfile.z": {"envbuilder.resolve.w"},
                }
            ),
            [["envbuilder.lockfile", "envbuilder.resolve"]],
        ),
    ],
)
def test_a_planted_cycle_is_found(graph: dict[str, set[str]], found: list[list[str]]) -> None:
    assert cycles(graph) == found
