"""Print the import graph between envbuilder's packages, read from the source (AST).

    python scripts/import_graph.py [--modules]

A "room" is a sub-package (``envbuilder.resolve``) or a top-level module
(``envbuilder.target``). Every ``import`` and ``from ... import`` counts,
including those inside functions and ``TYPE_CHECKING`` blocks, so that an arrow
is any dependency the code can take. Prints each room's line count and
arrows, then the cycles between rooms (strongly connected components of more
than one room); ``--modules`` also prints the module list with line counts.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "envbuilder"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return module
    candidate = ".".join(parts[:2])
    return candidate


def _imported(path: Path, module: str) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    modules = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules.items()}
    rooms: dict[str, int] = {}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        if module == "envbuilder":
            continue
        room = _room(module)
        rooms[room] = rooms.get(room, 0) + lines[module]
        for name in _imported(path, module):
            if not name.startswith("envbuilder.") or name == "envbuilder":
                continue
            target = _room(name)
            if target != room and target in {_room(m) for m in modules}:
                graph.setdefault(room, set()).add(target)
    if "--modules" in argv:
        for module in sorted(modules):
            print(f"{lines[module]:6d}  {module}")
        print()
    arrows = sum(len(v) for v in graph.values())
    print(f"{len(rooms)} rooms, {arrows} arrows")
    for room in sorted(rooms):
        targets = ", ".join(t.removeprefix("envbuilder.") for t in sorted(graph.get(room, ())))
        print(f"{rooms[room]:6d}  {room.removeprefix('envbuilder.')} -> {targets or '-'}")
    cycles = _cycles(graph)
    print(f"cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(c.removeprefix("envbuilder.") for c in cycle))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
