"""Verdicts are made again from the runs every time a lockfile is read, never trusted.

The content hash proves that a lockfile was not damaged, not who wrote it: anyone can
edit a verdict and reseal the file. Every run carries the outcome of each of its checks;
the verdict of each run, of each GPU and of each use follows from those by the rules in
`envbuilder.lockfile.verdicts`. `rejudged` derives them again, so that what readers act
on (``install``'s refusal of an unverified stack, ``query``'s ranking, ``doctor``) is what
the checks say, whatever verdicts the file records, and a file written by an envbuilder
with older rules is read by this one's. `verdict_problems` names where the two differ.
Standard library and envbuilder only (``doctor`` reads lockfiles in other environments).
"""

from __future__ import annotations

from dataclasses import replace

from envbuilder.lockfile.model import CompatLock, Entry
from envbuilder.lockfile.verdicts import (
    judge,
    rejudged_run,
)

__all__ = ["rejudged", "verdict_problems"]


def rejudged_entry(entry: Entry) -> Entry:
    """*entry* with every verdict made anew from its runs' checks."""
    runs = tuple(rejudged_run(r, entry.extra_runtime) for r in entry.runs)
    stale = tuple(rejudged_run(r, entry.extra_runtime) for r in entry.stale_runs)
    judged = judge(
        status=entry.status,
        resolver_reason=entry.resolver_reason,
        runs=runs,
        stale_runs=stale,
    )
    gpus, uses, verdict, last = judged.gpus, judged.uses, judged.verdict, judged.last
    evidence = entry.last_verified
    if runs and evidence is not None:
        evidence = replace(evidence, verdict=verdict, uses=uses)
    elif not runs:
        evidence = last
    return replace(
        entry,
        runs=runs,
        stale_runs=stale,
        gpus=gpus,
        uses=uses,
        verdict=verdict,
        last_verified=evidence,
    )


def rejudged(lock: CompatLock) -> CompatLock:
    """*lock* with every entry's verdicts made anew from its runs (`rejudged_entry`)."""
    return replace(lock, combinations=tuple(rejudged_entry(e) for e in lock.combinations))


def verdict_problems(recorded: CompatLock, judged: CompatLock) -> list[str]:
    """Where the verdicts *recorded* in a lockfile differ from those its runs give."""
    problems: list[str] = []
    for said, made in zip(recorded.combinations, judged.combinations, strict=True):
        for before, now in zip(said.uses, made.uses, strict=True):
            if before.verdict.verdict != now.verdict.verdict:
                problems.append(
                    f"{said.id}: {now.use} is recorded {before.verdict.verdict}, "
                    f"its runs give {now.verdict.verdict}"
                )
    return problems
