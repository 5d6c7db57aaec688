"""What each unit of a group costs, and how units are dealt out to a group's processes.

A *unit* is the checks that stay in one process (``GroupSpec.shard_unit_parts``: the
checks whose names agree in that many dotted parts, their workaround checks with them);
a group that is never split is one unit named after the group. Its cost is the seconds
its checks took in earlier results files (``unit_costs``), kept per run size in the
generated table ``_unit_costs.py``:

    python -m envbuilder.conformance.costs results/*.h200.json results/*.h200.quick.json

The runner splits a group into as many processes as its measured work needs, and a
group's processes take its units longest first, each to the process with the least
work so far (``deal``), so that the longest unit starts first and the processes end
close together. Where no cost is known, a unit costs the mean of the known ones.

Stdlib only: the runner reads this without importing torch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuilder.conformance.groups import GroupSpec, group_names, groups

__all__ = [
    "deal",
    "known_costs",
    "main",
    "makespan",
    "parts_for",
    "unit_costs",
    "unit_of",
    "write_table",
]


def unit_of(name: str, unit_parts: int | None) -> str:
    """The unit a check belongs to: its name's first ``unit_parts`` dotted parts, or its
    group for a group that is never split."""
    parts = name.split(".")
    if unit_parts is None:
        return parts[0]
    return ".".join(parts[:unit_parts])


def unit_costs(
    records: Iterable[Mapping[str, Any]], specs: Sequence[GroupSpec] | None = None
) -> dict[str, float]:
    """Seconds per unit in one results file's checks (workaround checks count towards the
    unit of the check they cover, whose name they extend)."""
    by_group = {g.name: g for g in (groups() if specs is None else specs)}
    costs: dict[str, float] = {}
    for record in records:
        spec = by_group.get(str(record.get("group")))
        if spec is None:
            continue
        unit = unit_of(str(record.get("name")), spec.shard_unit_parts)
        costs[unit] = costs.get(unit, 0.0) + float(record.get("duration_s") or 0.0)
    return costs


def known_costs(size: str) -> Mapping[str, float]:
    """The generated table's costs for a run size (``full`` or ``quick``)."""
    from envbuilder.conformance._unit_costs import UNIT_COSTS

    return UNIT_COSTS.get(size, {})


def _cost(unit: str, costs: Mapping[str, float], fallback: float) -> float:
    return costs.get(unit, fallback)


def deal(
    units: Sequence[str], count: int, costs: Mapping[str, float] | None = None
) -> list[list[str]]:
    """Units dealt to ``count`` processes: longest first, each to the process with the
    least work so far (the lowest-numbered among equals); each process's units stay in
    the order given. Without costs, unit k goes to process k mod ``count``."""
    if count < 1:
        raise ValueError(f"count {count}: give 1 or more")
    if costs is None:
        return [list(units[i::count]) for i in range(count)]
    known = [costs[u] for u in units if u in costs]
    fallback = sum(known) / len(known) if known else 1.0
    order = sorted(range(len(units)), key=lambda i: (-_cost(units[i], costs, fallback), i))
    load = [0.0] * count
    chosen: list[list[int]] = [[] for _ in range(count)]
    for i in order:
        part = min(range(count), key=lambda p: (load[p], p))
        load[part] += _cost(units[i], costs, fallback)
        chosen[part].append(i)
    return [[units[i] for i in sorted(part)] for part in chosen]


def makespan(items: Sequence[float], jobs: int) -> float:
    """When ``items`` (seconds each) end if ``jobs`` run at once, longest first, each
    starting as soon as one ends."""
    slots = [0.0] * max(jobs, 1)
    for item in sorted(items, reverse=True):
        slots[slots.index(min(slots))] += item
    return max(slots, default=0.0)


def parts_for(
    specs: Sequence[GroupSpec],
    costs: Mapping[str, float],
    *,
    jobs: int,
    wanted: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, int]:
    """How many processes each group is split across when ``jobs`` run side by side.

    Every group starts as one process; then, one at a time, the group whose split into
    one process more makes the run end soonest (the processes run longest first, each
    as soon as another ends: ``makespan``) gets one more, until no split shortens the
    run. A group that runs alone or is never split stays one process, and none has more
    processes than units or than ``jobs``. ``wanted``: the units of each group this run
    selects (default: every unit of the group in ``costs``)."""
    units: dict[str, list[str]] = {}
    for spec in specs:
        if wanted is not None and spec.name in wanted:
            units[spec.name] = list(wanted[spec.name])
        else:
            units[spec.name] = [u for u in costs if u == spec.name or u.startswith(spec.name + ".")]
    parts = {spec.name: 1 for spec in specs}
    shared = [s for s in specs if not s.runs_alone]

    def loads(name: str, count: int) -> list[float]:
        return [sum(costs.get(u, 0.0) for u in part) for part in deal(units[name], count, costs)]

    def span(trial: Mapping[str, int]) -> float:
        return makespan([x for s in shared for x in loads(s.name, trial[s.name])], jobs)

    best = span(parts)
    while True:
        options = [
            (span(parts | {s.name: parts[s.name] + 1}), i, s.name)
            for i, s in enumerate(shared)
            if s.shard_unit_parts is not None and parts[s.name] < min(len(units[s.name]), jobs)
        ]
        if not options:
            return parts
        value, _, name = min(options)
        if value >= best - 1e-9:
            return parts
        best = value
        parts[name] += 1


_HEADER = '''"""Measured seconds per unit of each group (see ``costs.py``).

Generated by ``python -m envbuilder.conformance.costs`` from these results files;
do not edit by hand:
{sources}
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["UNIT_COSTS"]

'''


def write_table(sources: Sequence[Path], target: Path) -> dict[str, dict[str, float]]:
    """Write the table from results files: per run size (a file whose ``runner.launch``
    or name says quick is a quick run), the longest each unit took in any of them."""
    table: dict[str, dict[str, float]] = {"full": {}, "quick": {}}
    for source in sources:
        data = json.loads(source.read_text(encoding="utf-8"))
        size = "quick" if ".quick." in source.name else "full"
        for unit, seconds in unit_costs(data.get("checks", [])).items():
            known = table[size].get(unit, 0.0)
            table[size][unit] = round(max(known, seconds), 1)
    names = "\n".join(f"- {p.name}" for p in sorted(sources, key=lambda p: p.name))
    lines = [_HEADER.format(sources=names), "UNIT_COSTS: Mapping[str, Mapping[str, float]] = {"]
    for size in ("full", "quick"):
        lines.append(f"    {json.dumps(size)}: {{")
        lines += [f"        {json.dumps(u)}: {table[size][u]!r}," for u in sorted(table[size])]
        lines.append("    },")
    lines.append("}")
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or any(a.startswith("-") for a in args):
        print(
            "usage: python -m envbuilder.conformance.costs RESULTS.json [...]\n"
            f"writes {Path(__file__).with_name('_unit_costs.py')} (groups: "
            f"{', '.join(group_names())})",
            file=sys.stderr,
        )
        return 2
    sources = [Path(a) for a in args]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        print(f"error: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    target = Path(__file__).with_name("_unit_costs.py")
    table = write_table(sources, target)
    print(f"wrote {target} ({len(table['full'])} full, {len(table['quick'])} quick units)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
