"""``envbuilder report``: a Markdown issue draft for the project at fault, from one cause's records.

The draft is addressed to the component the suite's experiments found at fault
(`Recorded.fault`); ``undecided`` drafts for no project and says so. It holds, in
this order: the title, a one-line summary in the terms of the API the script calls,
the versions the failure was recorded on, the minimal script (`scripts.render`),
expected vs actual as the suite measured it, the measured workarounds (cheapest
first: `WORKAROUND_TIER`, then graph breaks per step), and the upstream fix where an
experiment found one (``upstream_fix``). Pure: records in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envbuilder.conformance._record import WORKAROUND_TIER, WORKAROUNDS
from envbuilder.repro.causes import PROJECTS, KnownCause, listed
from envbuilder.repro.records import Recorded, RecordedRun
from envbuilder.repro.scripts import default_filename, recorded_outcome, recorded_versions, render

__all__ = ["MeasuredWorkaround", "draft", "measured_workarounds"]

#: how each workaround is applied, where the cause does not say it in its own terms
_GENERIC = {
    "mask-outside-compile": "build the attention bias object outside the compiled function",
    "mask-form": "hand the wrapper a mask form it converts correctly",
    "dynamo-disable": "call the attention behind `torch.compiler.disable` inside compiled code",
    "sdpa-under-compile": "use PyTorch's `scaled_dot_product_attention` under `torch.compile`",
    "sdpa-instead": "use PyTorch's `scaled_dot_product_attention` instead",
}


@dataclass(frozen=True, kw_only=True)
class MeasuredWorkaround:
    """A workaround that passed on some of a cause's checks, with what it cost there."""

    workaround: str
    fixed: tuple[str, ...]  # the cause's checks it passed on
    breaks_per_step: float | None
    breaks_per_call: float | None
    drops_fullgraph: bool

    def cost(self) -> str:
        parts = []
        if self.breaks_per_call is not None:
            parts.append(f"{self.breaks_per_call:g} graph break(s) per call")
        if self.breaks_per_step is not None:
            parts.append(f"{self.breaks_per_step:g} per step")
        if self.drops_fullgraph:
            parts.append("drops `fullgraph=True`")
        return ", ".join(parts)


_TIERS: dict[str, int] = {str(k): v for k, v in WORKAROUND_TIER.items()}
_REPOSITORIES: dict[str, str] = {str(k): v for k, v in PROJECTS.items()}


def _rank(w: MeasuredWorkaround) -> tuple[int, float, str]:
    tier = _TIERS.get(w.workaround, len(WORKAROUNDS))
    return tier, w.breaks_per_step if w.breaks_per_step is not None else 0.0, w.workaround


def measured_workarounds(run: RecordedRun, checks: Sequence[Recorded]) -> list[MeasuredWorkaround]:
    """The workarounds that passed on ``checks``' cases in ``run``, cheapest first."""
    found: dict[str, list[Recorded]] = {}
    for check in checks:
        for w in run.covering(check.name):
            if w.status == "pass" and w.workaround:
                found.setdefault(w.workaround, []).append(w)
    out = []
    for workaround, passed in found.items():
        per_step = [p.number("graph_breaks_per_step") for p in passed]
        per_call = [p.number("graph_breaks_per_call") for p in passed]
        steps = [v for v in per_step if v is not None]
        calls = [v for v in per_call if v is not None]
        out.append(
            MeasuredWorkaround(
                workaround=workaround,
                fixed=tuple(sorted({str(p.covers) for p in passed})),
                breaks_per_step=max(steps) if steps else None,
                breaks_per_call=max(calls) if calls else None,
                drops_fullgraph=any(p.numbers.get("drops_fullgraph") is True for p in passed),
            )
        )
    return sorted(out, key=_rank)


def _addressed(fault: str, evidence: str | None) -> list[str]:
    repository = _REPOSITORIES.get(fault)
    if repository is not None:
        return [
            f"**Project:** {fault} (file at https://github.com/{repository}/issues)"
            f" — decided by experiment: {evidence}",
        ]
    return [
        "**Project:** undecided — the suite's experiments did not decide who is at fault"
        + (f" ({evidence})" if evidence else "")
        + ", so this draft is addressed to no project; run the suite's experiments before"
        " filing it.",
    ]


def draft(cause: KnownCause, run: RecordedRun, checks: Sequence[Recorded]) -> str:
    """The issue draft for ``cause`` from ``checks`` (its failed checks in ``run``; the
    first is the one whose numbers are quoted)."""
    if not checks:
        raise ValueError(f"no checks recorded for cause {cause.key!r}")
    first = checks[0]
    fault = first.fault
    evidence = first.fault_evidence or (
        str(first.numbers["fault_evidence"]) if first.numbers.get("fault_evidence") else None
    )
    filename = default_filename(cause)
    script = render(cause, checks, filename=filename)
    where = "on a CUDA GPU or on the CPU" if cause.runs_on_cpu else "on a CUDA GPU"
    lines = [
        f"# {cause.title}",
        "",
        *_addressed(fault, evidence),
        "",
        f"**Summary:** {cause.summary}.",
        "",
        "## Versions",
        "",
        *(
            f"- {what}: {value}"
            for what, value in recorded_versions(
                first.run, checks, diffusers_used="diffusers" in cause.needs
            )
        ),
        "",
        f"Recorded by envbuilder's conformance suite {first.run.suite_version or '?'} on"
        f" {first.run.finished or '?'} ({first.run.combination or 'no combination'}).",
        "",
        "## Reproducer",
        "",
        f"`python {filename}` {where}; it needs {', '.join(cause.needs)}. It prints the versions"
        " it runs on, then expected vs actual, and exits 1 when it sees this failure, 0 when"
        " it does not, 2 when the environment cannot run the case.",
        "",
        "```python",
        script.rstrip("\n"),
        "```",
        "",
        "## Expected vs actual",
        "",
        f"- Expected: {cause.expected}.",
        f"- Actual ({first.name}): {recorded_outcome(first, cause)}.",
        f"- The same failure in {len(checks)} check(s): {listed(checks)}.",
        "",
        "## Workaround",
        "",
    ]
    direct = [c for c in checks if c.covers is None] or list(checks)
    workarounds = measured_workarounds(run, direct)
    if not workarounds:
        lines.append("None measured: no workaround check passed on these checks' cases.")
    for w in workarounds:
        how = cause.workarounds.get(w.workaround) or _GENERIC.get(w.workaround, w.workaround)
        cost = w.cost()
        lines.append(
            f"- `{w.workaround}`: {how}; measured to pass on {len(w.fixed)} of"
            f" {len(direct)} checks" + (f" ({cost})" if cost else "") + "."
        )
    fixes = sorted(
        {str(c.numbers["upstream_fix"]) for c in checks if c.numbers.get("upstream_fix")}
    )
    if fixes:
        lines += ["", "## Fix", "", "Found by experiment:", ""]
        lines += [f"- {fix}" for fix in fixes]
    return "\n".join(lines) + "\n"
