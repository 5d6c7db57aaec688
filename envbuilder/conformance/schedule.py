"""Which groups a run starts, how many processes each is split across, and in what order.

On a GPU the groups run side by side, ``jobs`` processes at once: first each group
that runs alone (its checks time kernels, and the GPU is otherwise idle while the fork
server still imports the compiler and diffusers), then every other group. A group is
split across as many processes as its measured work needs (``costs.parts_for``), and
the processes start longest first, so that the run's longest path starts at once.
On the CPU (one process at a time) the groups run one after another, in order.

Stdlib only: the runner reads this without importing torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envbuilder.conformance import costs
from envbuilder.conformance._record import matches
from envbuilder.conformance.groups import GroupSpec, group, group_names

__all__ = [
    "GPU_JOBS",
    "Part",
    "groups_for",
    "parts",
    "pattern_problems",
    "phases",
    "plan_parts",
    "selected_units",
]

#: worker processes run side by side on a GPU when ``jobs`` is not given (one at a time on
#: the CPU, where they would only compete for the same cores).
GPU_JOBS = 10


def _plain_group(pattern: str) -> str | None:
    """The group a pattern names plainly (its first dotted part), or None when that is a glob."""
    head = pattern.split(".", 1)[0]
    return None if any(c in head for c in "*?[") else head


def groups_for(patterns: Sequence[str]) -> tuple[str, ...]:
    """The groups a run must start: all, unless every pattern names its group plainly."""
    chosen = [p for p in patterns if p]
    if not chosen:
        return group_names()
    wanted: set[str] = set()
    for pattern in chosen:
        head = _plain_group(pattern)
        if head is None:
            return group_names()
        wanted.add(head)
    return tuple(g for g in group_names() if g in wanted)


def pattern_problems(patterns: Sequence[str]) -> list[str]:
    """What is wrong with ``--checks`` patterns that can be told before any check runs:
    a plain (non-glob) first part that names no group."""
    problems: list[str] = []
    for pattern in patterns:
        head = _plain_group(pattern)
        if not pattern.strip():
            problems.append("--checks '': give a check name, a dotted prefix or a glob")
        elif head is not None and head not in group_names():
            near = difflib.get_close_matches(head, group_names(), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(
                f"--checks {pattern!r}: no check group {head!r}{hint};"
                f" the groups are {', '.join(group_names())}"
            )
    return problems


def phases(groups: Sequence[str], jobs: int) -> list[list[str]]:
    """Batches of groups to run one after another: one group per batch when ``jobs`` is 1
    (in the given order), else each group that runs alone, then every other group together."""
    if jobs <= 1:
        return [[g] for g in groups]
    alone = [g for g in groups if group(g).runs_alone]
    shared = [g for g in groups if not group(g).runs_alone]
    return [[g] for g in alone] + ([shared] if shared else [])


def _unit_selected(unit: str, patterns: Sequence[str]) -> bool:
    """Whether ``patterns`` may select checks of ``unit`` (a check name extends its unit)."""
    chosen = [p for p in patterns if p]
    if not chosen:
        return True
    return any(matches(unit, [p]) or p.startswith(unit + ".") for p in chosen)


def selected_units(
    spec: GroupSpec, table: Mapping[str, float], patterns: Sequence[str]
) -> list[str]:
    """The units of ``spec`` in the cost table that ``patterns`` may select."""
    own = [u for u in table if u == spec.name or u.startswith(spec.name + ".")]
    return [u for u in own if _unit_selected(u, patterns)]


def parts(
    groups: Sequence[str],
    *,
    jobs: int,
    table: Mapping[str, float],
    patterns: Sequence[str] = (),
    fixed: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """How many processes each group is split across: ``fixed`` where given (never more
    than run at once, one for a group that cannot be split), else from the measured
    costs when processes run side by side, else one each."""
    specs = [group(g) for g in groups]
    if fixed is not None:
        return {
            s.name: 1 if s.shard_unit_parts is None else max(1, min(fixed.get(s.name, 1), jobs))
            for s in specs
        }
    if jobs <= 1:
        return {g: 1 for g in groups}
    wanted = {s.name: selected_units(s, table, patterns) for s in specs}
    return costs.parts_for(specs, table, jobs=jobs, wanted=wanted)


@dataclass(frozen=True, kw_only=True)
class Part:
    """One process of a group: part ``index`` of ``count``, with its estimated seconds."""

    group: str
    index: int
    count: int
    estimate_s: float


def plan_parts(
    batch: Sequence[str],
    counts: Mapping[str, int],
    *,
    table: Mapping[str, float],
    patterns: Sequence[str] = (),
) -> list[Part]:
    """The processes of a batch of groups, longest first (by the measured costs of the
    units each will take; in group order where nothing is known)."""
    rank = {g: i for i, g in enumerate(batch)}
    out: list[Part] = []
    for name in batch:
        spec = group(name)
        units = selected_units(spec, table, patterns)
        dealt = costs.deal(units, counts[name], table)
        for index in range(counts[name]):
            estimate = sum(table.get(u, 0.0) for u in dealt[index])
            out.append(Part(group=name, index=index, count=counts[name], estimate_s=estimate))
    return sorted(out, key=lambda p: (-p.estimate_s, rank[p.group], p.index))
