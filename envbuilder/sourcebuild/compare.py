"""Which bytes differ between two builds of a wheel: ``python -m envbuilder.sourcebuild.compare A B``.

Names each member that is in one wheel only or differs, and for a shared
library each ELF section whose bytes differ (with a few of the strings only
one side has), so that a build that is not reproducible says where.
Exit 0: the same bytes; 1: they differ; 2: a file cannot be read.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from envbuilder.sourcebuild.elf import elf_sections, is_elf

__all__ = ["compare_wheels", "main"]

_STRING = re.compile(rb"[\x20-\x7e]{6,}")


def compare_wheels(one: bytes, two: bytes) -> list[str]:
    """What differs between the wheels ``one`` and ``two``, one line each; empty when nothing."""
    import io

    if one == two:
        return []
    lines: list[str] = []
    with zipfile.ZipFile(io.BytesIO(one)) as a, zipfile.ZipFile(io.BytesIO(two)) as b:
        names_a, names_b = a.namelist(), b.namelist()
        for name in sorted(set(names_a) ^ set(names_b)):
            lines.append(f"{name}: only in {'the first' if name in names_a else 'the second'}")
        if names_a != names_b and set(names_a) == set(names_b):
            lines.append("the members are in another order")
        for name in sorted(set(names_a) & set(names_b)):
            body_a, body_b = a.read(name), b.read(name)
            info_a, info_b = a.getinfo(name), b.getinfo(name)
            if (info_a.date_time, info_a.external_attr) != (info_b.date_time, info_b.external_attr):
                lines.append(f"{name}: timestamp or mode differs")
            if body_a != body_b:
                lines.append(f"{name}: {len(body_a)} vs {len(body_b)} bytes")
                if is_elf(body_a) and is_elf(body_b):
                    lines.extend("  " + line for line in _compare_elf(body_a, body_b))
    if not lines:
        lines.append("the zip files differ (compression or headers), not their members")
    return lines


def _compare_elf(one: bytes, two: bytes) -> list[str]:
    sections_a = {s.name: one[s.offset : s.offset + s.size] for s in elf_sections(one) or ()}
    sections_b = {s.name: two[s.offset : s.offset + s.size] for s in elf_sections(two) or ()}
    lines = []
    for name in sorted(set(sections_a) | set(sections_b)):
        a, b = sections_a.get(name), sections_b.get(name)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"section {name}: in one library only")
            continue
        changed = sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))
        only_a = sorted(set(_STRING.findall(a)) - set(_STRING.findall(b)))[:3]
        only_b = sorted(set(_STRING.findall(b)) - set(_STRING.findall(a)))[:3]
        line = f"section {name}: {changed} of {max(len(a), len(b))} bytes differ"
        if only_a or only_b:
            shown_a = ", ".join(s.decode() for s in only_a)
            shown_b = ", ".join(s.decode() for s in only_b)
            line += f"; e.g. {shown_a} / {shown_b}"
        lines.append(line)
    return lines


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m envbuilder.sourcebuild.compare WHEEL WHEEL", file=sys.stderr)
        return 2
    try:
        one, two = (Path(p).read_bytes() for p in argv)
        lines = compare_wheels(one, two)
    except (OSError, zipfile.BadZipFile) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for path, data in zip(argv, (one, two), strict=True):
        print(f"{hashlib.sha256(data).hexdigest()}  {path}")
    print("\n".join(lines) if lines else "same bytes")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
