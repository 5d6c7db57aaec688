"""The rule that turns conformance checks into a verdict.

One results file (a *run*) gets a verdict from its checks. A *direct* gate
check is one with ``gate = true`` and ``workaround = null``; a *workaround*
check is one with a non-null ``workaround`` (its ``gate`` flag is not
consulted: such checks only ever matter when a direct check of the same
group fails). "Failed" means status ``fail``, ``error`` or ``timeout``;
``skip`` neither passes nor fails.

=====================================================  ============================
A run whose checks say …                               gets the verdict
=====================================================  ============================
no gate check passed (none ran, or all were skipped)   ``unverified``
every direct gate check passed or was skipped          ``verified``
… and the resolver added a CUDA runtime                ``verified-with-workaround``
  (``extra_runtime``)                                    naming ``cuda-runtime:<req>``
some direct gate checks failed, and for each one the   ``verified-with-workaround``
  same group holds a workaround whose checks all         naming those workarounds
  passed (at least one, none failed)                     (e.g. ``sdpa-under-compile``)
some direct gate check failed with no such workaround  ``broken``, naming the failed
                                                         checks nobody worked around
=====================================================  ============================

A combination's verdict:

=====================================================  ============================
the resolver said ``unsatisfiable`` or ``error``       ``unsatisfiable`` (its reason)
resolved, no accepted results yet                      ``unverified``
resolved, with runs                                    per GPU model the worst of its
                                                         runs (runs that disagree are
                                                         all kept, flagged ``conflict``);
                                                         overall the worst of the GPUs
=====================================================  ============================

"Worst" follows the order verified < verified-with-workaround < unverified
< broken < unsatisfiable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from envbuilder.lockfile.model import VERDICT_RANK, CheckOutcome, GpuVerdict, Run, Verdict

__all__ = ["FAILED", "combination_verdict", "gpu_verdicts", "run_verdict", "worst"]

FAILED = frozenset({"fail", "error", "timeout"})


def _workaround_passes(checks: Sequence[CheckOutcome], group: str, workaround: str) -> bool:
    mine = [c for c in checks if c.group == group and c.workaround == workaround]
    return bool(mine) and all(c.status == "pass" for c in mine)


def run_verdict(checks: Sequence[CheckOutcome], extra_runtime: Sequence[str] = ()) -> Verdict:
    """The verdict of one run (see the module's table)."""
    gates = [c for c in checks if c.gate and c.workaround is None]
    if not any(c.status == "pass" for c in gates):
        return Verdict(verdict="unverified", reason="no gate check passed")
    failed = sorted((c for c in gates if c.status in FAILED), key=lambda c: c.name)
    runtime = tuple(f"cuda-runtime:{req}" for req in extra_runtime)
    if not failed:
        if runtime:
            return Verdict(
                verdict="verified-with-workaround",
                reason=f"all gate checks passed with the added CUDA runtime {', '.join(extra_runtime)}",
                workarounds=runtime,
            )
        passed = sum(c.status == "pass" for c in gates)
        return Verdict(verdict="verified", reason=f"all {passed} gate checks passed")
    used: set[str] = set()
    uncovered: list[str] = []
    names = sorted({c.workaround for c in checks if c.workaround is not None})
    for check in failed:
        cover = [w for w in names if _workaround_passes(checks, check.group, w)]
        if cover:
            used.add(cover[0])
        else:
            uncovered.append(check.name)
    failed_names = tuple(c.name for c in failed)
    if uncovered:
        details = "; ".join(
            f"{c.name} {c.status}" + (f" ({c.reason})" if c.reason else "")
            for c in failed
            if c.name in uncovered
        )
        return Verdict(
            verdict="broken",
            reason=f"failing gate checks: {details}",
            failing_checks=tuple(uncovered),
        )
    workarounds = tuple(sorted(used)) + runtime
    return Verdict(
        verdict="verified-with-workaround",
        reason=f"{', '.join(failed_names)} failed; passed with {', '.join(workarounds)}",
        workarounds=workarounds,
        failing_checks=failed_names,
    )


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst verdict; on ties the first one (callers pass them in a stable order)."""
    return max(verdicts, key=lambda v: VERDICT_RANK[v.verdict])


def gpu_verdicts(runs: Sequence[Run]) -> tuple[GpuVerdict, ...]:
    """Group runs by GPU model; flag (never drop) runs of one model that disagree."""
    keys = sorted({(r.gpu, r.compute_capability or "") for r in runs})
    out: list[GpuVerdict] = []
    for gpu, cc in keys:
        mine = [r for r in runs if (r.gpu, r.compute_capability or "") == (gpu, cc)]
        distinct = sorted({r.verdict.verdict for r in mine}, key=VERDICT_RANK.__getitem__)
        conflict = len(distinct) > 1
        chosen = worst(r.verdict for r in mine)
        if conflict:
            chosen = Verdict(
                verdict=chosen.verdict,
                reason=f"conflicting results on {gpu} ({', '.join(distinct)}); keeping the worst: "
                + chosen.reason,
                workarounds=chosen.workarounds,
                failing_checks=chosen.failing_checks,
            )
        out.append(
            GpuVerdict(
                gpu=gpu,
                compute_capability=cc or None,
                verdict=chosen,
                runs=tuple(r.source for r in mine),
                conflict=conflict,
            )
        )
    return tuple(out)


def combination_verdict(
    *, status: str, resolver_reason: str, gpus: Sequence[GpuVerdict]
) -> Verdict:
    """The combination's verdict from the resolver's status and its per-GPU verdicts."""
    if status != "resolved":
        prefix = "" if status == "unsatisfiable" else f"resolver {status}: "
        return Verdict(verdict="unsatisfiable", reason=prefix + (resolver_reason or status))
    if not gpus:
        return Verdict(verdict="unverified", reason="resolved; no conformance results yet")
    chosen = max(gpus, key=lambda g: VERDICT_RANK[g.verdict.verdict])
    if len(gpus) == 1:
        reason = f"on {chosen.gpu}: {chosen.verdict.reason}"
    else:
        others = ", ".join(f"{g.gpu}: {g.verdict.verdict}" for g in gpus)
        reason = f"worst of {len(gpus)} GPUs ({others}); on {chosen.gpu}: {chosen.verdict.reason}"
    return Verdict(
        verdict=chosen.verdict.verdict,
        reason=reason,
        workarounds=chosen.verdict.workarounds,
        failing_checks=chosen.verdict.failing_checks,
    )
