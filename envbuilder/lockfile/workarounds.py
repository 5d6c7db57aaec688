"""Which workarounds work on a failed gate check, what each costs, and which is cheapest.

The verdict rule (`envbuilder.lockfile.verdicts`, whose docstring is its specification)
asks these questions of a failed direct check C; the answers follow its second table
(a workaround check W *covers* C) and the paragraph under it (a workaround *works* on C;
the cheapest of those that work): `covers`, `leaves_failure`, `workarounds_that_work`,
`cheapest`. `options` lists the workarounds that work, cheapest first, as a verdict
carries them, and `cost_text` says what one costs as measured. Whether a workaround keeps
xformers is the suite's vocabulary (`envbuilder.conformance._record.KEEPS_XFORMERS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from envbuilder.conformance._record import KEEPS_XFORMERS, WORKAROUND_TIER, Workaround
from envbuilder.lockfile.model import (
    CheckOutcome,
    Verdict,
    WorkaroundChoice,
    WorkaroundOption,
)

__all__ = [
    "cheapest",
    "cost_key",
    "cost_text",
    "covers",
    "keeps_xformers",
    "leaves_failure",
    "merged_options",
    "options",
    "workarounds_that_work",
]


def keeps_xformers(workaround: Workaround) -> bool:
    """Whether the user's code still calls xformers with *workaround* applied."""
    return KEEPS_XFORMERS[workaround]


def covers(workaround: CheckOutcome, failed: CheckOutcome) -> bool:
    """Whether the workaround check *workaround* re-ran the case of the direct check *failed*."""
    if workaround.workaround is None:
        return False
    if workaround.covers is not None:
        return workaround.covers == failed.name
    return workaround.uses is None and workaround.group == failed.group


def _parts(check: CheckOutcome) -> list[str]:
    return check.name.split(".")


def leaves_failure(workaround: CheckOutcome, failed: CheckOutcome) -> bool:
    """Whether *workaround* passed while leaving *failed*'s own failure: a ``nobreaks`` check
    asks for no graph break, so a workaround counts there only with none measured (suites
    before 3.0 passed dynamo-disable on it with the very break the check failed for)."""
    return "nobreaks" in _parts(failed) and workaround.cost.graph_breaks != 0


def _drops_fullgraph(workaround: CheckOutcome, failed: CheckOutcome) -> bool:
    """Whether *workaround* gave up ``fullgraph=True``: as it recorded, else (suites before
    3.0) a graph break measured on a case compiled with ``fullgraph`` (its name says so)."""
    cost = workaround.cost
    if cost.drops_fullgraph is not None:
        return cost.drops_fullgraph
    return "fullgraph" in _parts(failed) and (cost.graph_breaks or 0) > 0


def _most(values: Iterable[float | None]) -> float | None:
    """The largest measured value; None when none was measured."""
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


def workarounds_that_work(
    checks: Sequence[CheckOutcome], failed: CheckOutcome
) -> list[WorkaroundChoice]:
    """Every workaround whose checks covering *failed* all passed without leaving its failure
    (`leaves_failure`), with its cost there; suite errors are no evidence either way."""
    by_name: dict[Workaround, list[CheckOutcome]] = {}
    for check in checks:
        if check.workaround is not None and not check.suite_error and covers(check, failed):
            by_name.setdefault(check.workaround, []).append(check)
    out: list[WorkaroundChoice] = []
    for name, mine in sorted(by_name.items()):
        if not all(c.status == "pass" and not leaves_failure(c, failed) for c in mine):
            continue
        costs = [c.cost for c in mine]
        breaks = [c.graph_breaks for c in costs]
        times = [c.step_ms for c in costs]
        out.append(
            WorkaroundChoice(
                check=failed.name,
                workaround=name,
                evidence=tuple(sorted(c.name for c in mine)),
                graph_breaks=None if None in breaks else max(b for b in breaks if b is not None),
                step_ms=None if None in times else max(t for t in times if t is not None),
                tier=WORKAROUND_TIER[name],
                breaks_per_call=_most(c.breaks_per_call for c in costs),
                breaks_per_step=_most(c.breaks_per_step for c in costs),
                drops_fullgraph=any(_drops_fullgraph(c, failed) for c in mine),
            )
        )
    return out


def cost_key(c: WorkaroundChoice | WorkaroundOption) -> tuple[int, bool, float, str]:
    """Cheapest first: the workaround's tier, then graph breaks per step (unmeasured after
    measured), then its name. Never step time: at the suite's sizes it is launch overhead."""
    return (c.tier, c.breaks_per_step is None, c.breaks_per_step or 0.0, c.workaround)


def cheapest(choices: Iterable[WorkaroundChoice]) -> WorkaroundChoice | None:
    """The cheapest of *choices* (`cost_key`)."""
    return min(choices, key=cost_key, default=None)


def _worst_cost(values: Sequence[float | int | None]) -> float | int | None:
    return None if not values or None in values else max(v for v in values if v is not None)


def _option(
    name: Workaround, fixes: Iterable[str], costs: Sequence[WorkaroundChoice | WorkaroundOption]
) -> WorkaroundOption:
    """One workaround's option: the checks it fixes and its worst cost over *costs*."""
    breaks = _worst_cost([c.graph_breaks for c in costs])
    ms = _worst_cost([c.step_ms for c in costs])
    return WorkaroundOption(
        workaround=name,
        keeps_xformers=keeps_xformers(name),
        fixes=tuple(sorted(set(fixes))),
        graph_breaks=None if breaks is None else int(breaks),
        step_ms=None if ms is None else float(ms),
        tier=WORKAROUND_TIER[name],
        breaks_per_call=_most(c.breaks_per_call for c in costs),
        breaks_per_step=_most(c.breaks_per_step for c in costs),
        drops_fullgraph=any(c.drops_fullgraph for c in costs),
    )


def options(working: Iterable[WorkaroundChoice]) -> tuple[WorkaroundOption, ...]:
    """Per workaround name, the failed checks it works on and its worst cost over them;
    cheapest first (`cost_key`)."""
    by_name: dict[Workaround, list[WorkaroundChoice]] = {}
    for choice in working:
        by_name.setdefault(choice.workaround, []).append(choice)
    out = [_option(name, (c.check for c in mine), mine) for name, mine in by_name.items()]
    return tuple(sorted(out, key=cost_key))


def merged_options(verdicts: Iterable[Verdict]) -> tuple[WorkaroundOption, ...]:
    """The options of several verdicts (several uses or GPUs), each workaround once."""
    merged: dict[Workaround, list[WorkaroundOption]] = {}
    for v in verdicts:
        for o in v.options:
            merged.setdefault(o.workaround, []).append(o)
    out = [_option(name, (c for o in mine for c in o.fixes), mine) for name, mine in merged.items()]
    return tuple(sorted(out, key=cost_key))


def cost_text(choice: WorkaroundChoice | WorkaroundOption) -> str:
    """What a workaround costs, as measured: ``1 graph break per call, 3 per step, drops
    fullgraph=True``; the breaks of the check's own function where per call and per step
    were not measured; empty when nothing was."""
    parts = []
    call, step = choice.breaks_per_call, choice.breaks_per_step
    if call is not None or step is not None:
        said = []
        if call is not None:
            said.append(f"{call:g} graph break{'s' if call != 1 else ''} per call")
        if step is not None:
            said.append(f"{step:g} per step" if said else f"{step:g} graph breaks per step")
        parts.append(", ".join(said))
    elif choice.graph_breaks is not None:
        parts.append(f"{choice.graph_breaks} graph break{'s' if choice.graph_breaks != 1 else ''}")
    if choice.drops_fullgraph:
        parts.append("drops fullgraph=True")
    return ", ".join(parts)
