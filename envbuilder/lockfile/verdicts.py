"""The rule that turns conformance checks into verdicts, one per use and one overall.

A check speaks for the *uses* it lists (``inference`` = eager forward under
``no_grad``, ``inference-compiled``, ``training`` = eager forward, backward and
optimizer step, ``training-compiled``); a check from a results/1 file lists
none and speaks for every use. A *direct* gate check has ``gate = true`` and
``workaround = null``; a *workaround* check has a non-null ``workaround`` (its
``gate`` flag is not consulted). "Failed" means status ``fail``, ``error``,
``timeout`` or ``invalid`` (a numeric check that could not have told a right
answer from the nearest wrong one is a failed gate, never a pass); ``skip``
neither passes nor fails.

A check has a call path (``via``): None when it called torch and xformers directly (what
a combination pins), else the library it reached them through (``diffusers``). A
combination's verdict for U is made of its direct checks only; each library gets its own
verdict for U by the same rules over its checks (`advisory`), shown beside the row and never
part of its verdict. A check whose error the suite's own code raised (``fault_component``
``suite``) is listed in ``suite_errors`` and counted by no verdict, as a gate or as a
workaround's evidence.

For one use U, over the (direct, or one library's) checks that speak for U:

=====================================================  ============================
the checks for U say …                                 U's verdict
=====================================================  ============================
no direct gate check passed (none ran, or all were     ``unverified``
  skipped)
every direct gate check passed or was skipped          ``verified``
… and the resolver added a CUDA runtime                ``verified-with-workaround``
  (``extra_runtime``)                                    naming ``cuda-runtime:<req>``
some direct gate checks failed, and each one has a     ``verified-with-workaround``
  workaround that works on it (below) and keeps          naming, per failed check, the
  xformers                                               cheapest one that keeps it
some failed direct gate check is passed only by        ``xformers-unusable``: the use
  workarounds that replace xformers (every other         works on this stack without
  failed check has a working workaround)                 xformers, not with it
some failed direct gate check has no workaround        ``broken``, naming the failed
  that works on it                                       checks nobody worked around
=====================================================  ============================

Whether a workaround keeps xformers comes from the suite's vocabulary
(`envbuilder.conformance._record.KEEPS_XFORMERS`: ``dynamo-disable`` keeps it,
``sdpa-under-compile`` and ``sdpa-instead`` replace it); a name outside it is taken as
replacing xformers, since nothing says the user's xformers call survives it. Every verdict
lists, in ``options``, every workaround that works on at least one failed check, cheapest
first, with whether it keeps xformers and which checks it passed. An ``xformers-unusable``
verdict is an answer, not a workaround: the consumers (`query`, the site) name the
combination of the same Python, CUDA and torch without xformers (the id without its
``-xformers…`` part) when that one is verified for the use (`torch_alone_id`).

The next table and paragraph, which workarounds work on a failed check and which is the
cheapest, are `envbuilder.lockfile.workarounds`' part of the rule (its names that
verdicts use are importable from here too). A workaround check W covers a failed direct
check C:

=====================================================  ============================
W (results/2) has ``covers`` = C's name                W re-ran C's exact case
W (results/1: no ``covers``) is in C's group           the group-wide rule of /1
anything else                                          W does not cover C
=====================================================  ============================

A workaround (by name) *works* on C when it has at least one check covering C
and every one of those passed without leaving C's own failure: on a ``nobreaks``
check (one that asks for no graph break) only with ``graph_breaks`` measured 0.
Of those that work, the cheapest is chosen: lowest tier (`WORKAROUND_TIER`: 0 keeps
xformers with no graph break, 1 keeps it behind a break, 2 replaces it), then fewest
``graph_breaks_per_step`` (unmeasured after measured), then the workaround's name — never
``step_ms``, which at the suite's sizes is launch overhead. Its cost says the breaks per
call and per step and whether it gives up ``fullgraph=True`` (as recorded, else a break on
a case compiled with ``fullgraph``).
For ``verified-with-workaround`` only the ones that keep xformers are chosen from; for
``xformers-unusable`` the cheapest that keeps xformers where one works on C, else the
cheapest replacement.

A run's overall verdict is the worst of its four use verdicts. A combination's:

=====================================================  ============================
the resolver said ``unsatisfiable`` or ``error``       ``unsatisfiable`` (its reason),
                                                         for every use
resolved, no accepted results yet                      ``unverified``, for every use
resolved, no runs on the current lock, runs on an      ``unverified``, for every use,
  older one (stale evidence)                             its reason saying "last
                                                         verified <date> on lock
                                                         <sha12>: <verdict>" (that
                                                         use's verdict then)
resolved, with runs (on the current lock)              per GPU model and use the worst
                                                         of its runs (all kept; runs
                                                         that disagree on a check both
                                                         ran are flagged ``conflict``,
                                                         a --quick run beside a full
                                                         one is not); per use the
                                                         worst of the GPUs; overall
                                                         the worst of the uses
=====================================================  ============================

"Worst" follows the order verified < verified-with-workaround < xformers-unusable
< unverified < broken < unsatisfiable. ``xformers-unusable`` sits after the verdicts that
install the row as it is (the user's xformers code works, changed or not) and before
``unverified``: it is measured evidence that the use runs on this stack once xformers is
replaced, which says more than no evidence, while the row is not installable for that use.

The stale evidence a combination shows (`last_verified`) comes from the older
lock whose newest run finished last; its runs are judged as a combination's
are (per GPU, per use, worst), and its date is that newest run's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from envbuilder.conformance._record import FAILED, USES, VIAS, Use, Via
from envbuilder.lockfile.model import (
    VERDICT_RANK,
    Advisory,
    CheckOutcome,
    GpuVerdict,
    InfoCheck,
    LastVerified,
    Run,
    UseVerdict,
    Verdict,
    WorkaroundChoice,
    WorkaroundOption,
    use_verdict,
)
from envbuilder.lockfile.workarounds import (
    cheapest,
    cost_key,
    cost_text,
    keeps_xformers,
    merged_options,
    options,
    workarounds_that_work,
)
from envbuilder.model import Status as ResolveStatus

__all__ = [
    "FAILED",
    "Judged",
    "advisory",
    "cheapest",
    "combination_use_verdicts",
    "combination_verdict",
    "cost_text",
    "gpu_verdicts",
    "judge",
    "keeps_xformers",
    "last_verified",
    "options",
    "overall",
    "rejudged_run",
    "run_use_verdicts",
    "run_verdict",
    "torch_alone_id",
    "use_verdict_of",
    "workarounds_that_work",
    "worst",
]


def torch_alone_id(combination_id: str) -> str | None:
    """The id of the same Python/CUDA/torch without xformers (``py3.12-cu130-torch2.11.0``
    for ``py3.12-cu130-torch2.11.0-xformers0.0.35-cudart``); None for a torch-alone id."""
    head, sep, _ = combination_id.partition("-xformers")
    return head if sep else None


def _describe(check: CheckOutcome) -> str:
    text = f"{check.name} {check.status}"
    measured = check.measurement
    if check.status == "invalid" and measured is not None:
        text += f" (sensitivity {measured.sensitivity_ratio:.3g}× its bound)"
    elif check.reason:
        first = check.reason.splitlines()[0].split(" | ")[0]
        text += f" ({first[:117] + '…' if len(first) > 120 else first})"
    return text


def _cost(choice: WorkaroundChoice | WorkaroundOption) -> str:
    text = cost_text(choice)
    return f" ({text})" if text else ""


def _judged(checks: Sequence[CheckOutcome], extra_runtime: Sequence[str] = ()) -> Verdict:
    """The verdict of *checks* (one use's, of one call path, no suite errors): the module's
    first table."""
    gates = [c for c in checks if c.direct_gate]
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
    working = {c.name: workarounds_that_work(checks, c) for c in failed}
    listed = options(w for ws in working.values() for w in ws)
    uncovered = [c for c in failed if not working[c.name]]
    if uncovered:
        return Verdict(
            verdict="broken",
            reason=f"{_count(uncovered)} with no working workaround: {_some(uncovered)}",
            failing_checks=tuple(c.name for c in uncovered),
            options=listed,
        )
    kept = {n: [w for w in ws if keeps_xformers(w.workaround)] for n, ws in working.items()}
    replaced = [c for c in failed if not kept[c.name]]
    if replaced:
        chosen = [cheapest(kept[c.name] or working[c.name]) for c in failed]
        picked = [c for c in chosen if c is not None]
        without = sorted({c.workaround for c in picked if not keeps_xformers(c.workaround)})
        return Verdict(
            verdict="xformers-unusable",
            reason=f"xformers is not usable here: {len(replaced)} of {_count(failed)} "
            f"{'passes' if len(replaced) == 1 else 'pass'} only without xformers "
            f"({', '.join(without)})",
            workarounds=tuple(sorted({c.workaround for c in picked})) + runtime,
            failing_checks=tuple(c.name for c in failed),
            choices=tuple(picked),
            options=listed,
        )
    chosen_kept = [cheapest(kept[c.name]) for c in failed]
    picked = [c for c in chosen_kept if c is not None]
    names = sorted({c.workaround for c in picked}, key=lambda n: cost_key(_listed(listed, n)))
    details = ", ".join(f"{n}{_cost(_listed(listed, n))}" for n in names)
    return Verdict(
        verdict="verified-with-workaround",
        reason=f"{_count(failed)} {'passes' if len(failed) == 1 else 'pass'} with {details}",
        workarounds=tuple(names) + runtime,
        failing_checks=tuple(c.name for c in failed),
        choices=tuple(picked),
        options=listed,
    )


#: how an advisory names the backend of the library its failing checks used
_BACKEND: dict[str, str] = {"xformers": "xformers backend", "sdpa": "native backend"}


def _info(check: CheckOutcome) -> InfoCheck:
    first = (check.reason.strip().splitlines() or [""])[0].split(" | ")[0]
    return InfoCheck(name=check.name, status=check.status, reason=first[:200])


def advisory(via: Via, checks: Sequence[CheckOutcome], use: Use) -> Advisory | None:
    """The verdict for *use* of the library *via* from its checks among *checks* (None when
    none of them speaks for *use*): the same rules as the combination's, its suite errors
    apart, its checks that gate nothing (``info``) kept as evidence of who is hit."""
    mine = [c for c in checks if c.via == via]
    speaking = [c for c in mine if c.speaks_for(use)]
    if not speaking:
        return None
    verdict = _judged([c for c in speaking if not c.suite_error])
    errors = tuple(sorted(c.name for c in speaking if c.suite_error))
    versions = sorted({v for c in mine if isinstance(v := c.numbers.get(via), str) and v})
    version = versions[-1] if versions else None
    by_name = {c.name: c for c in mine}
    backends = sorted(
        {_BACKEND.get(by_name[n].impl or "", "") for n in verdict.failing_checks} - {""}
    )
    name = " ".join(
        [via, *([version] if version else []), *backends[: 1 if len(backends) == 1 else 0]]
    )
    info = tuple(
        _info(c)
        for c in sorted(mine, key=lambda c: c.name)
        if not c.gate and c.workaround is None and (c.uses == () or c.speaks_for(use))
    )
    return Advisory(
        via=via,
        library=via,
        version=version,
        name=name,
        verdict=replace(verdict, suite_errors=errors),
        info=info,
    )


def use_verdict_of(
    checks: Sequence[CheckOutcome], use: Use, extra_runtime: Sequence[str] = ()
) -> Verdict:
    """The verdict of one run for one use (see the module's first table): made of the checks
    that call torch and xformers directly (``via`` None); each library the suite reached
    them through gets its own (`advisory`); suite errors are listed and counted nowhere."""
    mine = [c for c in checks if c.speaks_for(use)]
    direct = [c for c in mine if c.via is None and not c.suite_error]
    verdict = _judged(direct, extra_runtime)
    advisories = tuple(a for v in VIAS if (a := advisory(v, checks, use)) is not None)
    errors = tuple(sorted(c.name for c in mine if c.suite_error))
    return replace(verdict, suite_errors=errors, advisories=advisories)


def _count(checks: Sequence[CheckOutcome]) -> str:
    return f"{len(checks)} failing gate check{'s' if len(checks) != 1 else ''}"


def _some(checks: Sequence[CheckOutcome], shown: int = 3) -> str:
    """The first *shown* of *checks* described, and how many more: reasons stay short."""
    text = "; ".join(_describe(c) for c in checks[:shown])
    return text + (f"; and {len(checks) - shown} more" if len(checks) > shown else "")


def _listed(listed: Sequence[WorkaroundOption], name: str) -> WorkaroundOption:
    return next(o for o in listed if o.workaround == name)


def _with_merged(chosen: Verdict, verdicts: Iterable[Verdict]) -> Verdict:
    """*chosen* carrying, per library, the worst advisory of *verdicts* (the first on ties)
    and every suite error any of them lists."""
    every = list(verdicts)
    merged: list[Advisory] = []
    for via in VIAS:
        found = [a for v in every for a in v.advisories if a.via == via]
        if found:
            merged.append(max(found, key=lambda a: VERDICT_RANK[a.verdict.verdict]))
    errors = tuple(sorted({e for v in every for e in v.suite_errors}))
    return replace(chosen, advisories=tuple(merged), suite_errors=errors)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst verdict; on ties the first one (callers pass them in a stable order); its
    advisories the worst per library of them all (`_with_merged`)."""
    every = list(verdicts)
    return _with_merged(max(every, key=lambda v: VERDICT_RANK[v.verdict]), every)


def overall(uses: Sequence[UseVerdict]) -> Verdict:
    """The worst of the per-use verdicts, its reason naming the uses it comes from."""
    verdicts = [u.verdict for u in uses]
    if all(v == verdicts[0] for v in verdicts):
        return verdicts[0]
    return _with_merged(_overall(uses), verdicts)


def _overall(uses: Sequence[UseVerdict]) -> Verdict:
    verdicts = [u.verdict for u in uses]
    rank = max(VERDICT_RANK[v.verdict] for v in verdicts)
    mine = [u for u in uses if VERDICT_RANK[u.verdict.verdict] == rank]
    reasons: dict[str, list[str]] = {}
    for u in mine:
        reasons.setdefault(u.verdict.reason, []).append(u.use)
    reason = "; ".join(f"for {', '.join(names)}: {text}" for text, names in reasons.items())
    others = [u for u in uses if u not in mine]
    if others:
        reason += " (" + ", ".join(f"{u.use}: {u.verdict.verdict}" for u in others) + ")"
    named = {w for u in mine for w in u.verdict.workarounds}
    workarounds = tuple(sorted(named, key=lambda w: (w.startswith("cuda-runtime:"), w)))
    choices = sorted({c for u in mine for c in u.verdict.choices}, key=lambda c: c.check)
    return Verdict(
        verdict=mine[0].verdict.verdict,
        reason=reason,
        workarounds=workarounds,
        failing_checks=tuple(sorted({c for u in mine for c in u.verdict.failing_checks})),
        choices=tuple(choices),
        options=merged_options(u.verdict for u in mine),
    )


def run_use_verdicts(
    checks: Sequence[CheckOutcome], extra_runtime: Sequence[str] = ()
) -> tuple[UseVerdict, ...]:
    """One run's verdict for each use, in `USES` order."""
    return tuple(UseVerdict(use=u, verdict=use_verdict_of(checks, u, extra_runtime)) for u in USES)


def run_verdict(checks: Sequence[CheckOutcome], extra_runtime: Sequence[str] = ()) -> Verdict:
    """The overall verdict of one run: the worst of its use verdicts."""
    return overall(run_use_verdicts(checks, extra_runtime))


def _for_use(use: Use, record: Run | GpuVerdict | LastVerified) -> Verdict:
    return use_verdict(record.uses, use)


def _conflicted(chosen: Verdict, gpu: str, distinct: Sequence[str]) -> Verdict:
    return replace(
        chosen,
        reason=f"conflicting results on {gpu} ({', '.join(distinct)}); keeping the worst: "
        + chosen.reason,
    )


def runs_disagree(runs: Sequence[Run]) -> bool:
    """Whether some check that two of ``runs`` both ran said different things in them.

    Runs whose verdicts differ only because one ran checks the other did not (a --quick
    run beside a full one, or suites of two versions) do not disagree: the worst verdict
    stands and nothing is flagged. Runs without a record of their checks disagree when
    their verdicts do."""
    seen: dict[str, str] = {}
    for run in runs:
        for c in run.checks:
            if seen.setdefault(c.name, c.status) != c.status:
                return True
    if any(not r.checks for r in runs):
        keys = {(r.verdict.verdict, tuple(u.verdict.verdict for u in r.uses)) for r in runs}
        return len(keys) > 1
    return False


def _worst_of_runs(
    runs: Sequence[Run], gpu: str, pick: Callable[[Run], Verdict], *, disagree: bool
) -> Verdict:
    """The worst verdict of ``runs``; among equals, the one of the run with the most gate
    checks speaks (a full run's reason rather than a --quick run's). When the runs
    *disagree* (`runs_disagree`) and their verdicts differ, the reason says so."""
    distinct = sorted({pick(r).verdict for r in runs}, key=VERDICT_RANK.__getitem__)
    by_evidence = sorted(runs, key=lambda r: -sum(1 for c in r.checks if c.gate))
    chosen = worst(pick(r) for r in by_evidence)
    return _conflicted(chosen, gpu, distinct) if disagree and len(distinct) > 1 else chosen


def gpu_verdicts(runs: Sequence[Run]) -> tuple[GpuVerdict, ...]:
    """Group runs by GPU model; flag (never drop) runs of one model that disagree on a check
    they both ran (`runs_disagree`)."""
    keys = sorted({(r.gpu, r.compute_capability or "") for r in runs})
    out: list[GpuVerdict] = []
    for gpu, cc in keys:
        mine = [r for r in runs if (r.gpu, r.compute_capability or "") == (gpu, cc)]
        conflict = runs_disagree(mine)
        out.append(
            GpuVerdict(
                gpu=gpu,
                compute_capability=cc or None,
                verdict=_worst_of_runs(mine, gpu, lambda r: r.verdict, disagree=conflict),
                uses=tuple(
                    UseVerdict(
                        use=u,
                        verdict=_worst_of_runs(mine, gpu, partial(_for_use, u), disagree=conflict),
                    )
                    for u in USES
                ),
                runs=tuple(r.source for r in mine),
                conflict=conflict,
            )
        )
    return tuple(out)


def _combined(
    status: ResolveStatus,
    resolver_reason: str,
    gpus: Sequence[GpuVerdict],
    pick: Callable[[GpuVerdict | LastVerified], Verdict],
    last: LastVerified | None = None,
) -> Verdict:
    if status != "resolved":
        prefix = "" if status == "unsatisfiable" else f"resolver {status}: "
        return Verdict(verdict="unsatisfiable", reason=prefix + (resolver_reason or status))
    if not gpus:
        if last is not None:
            return Verdict(
                verdict="unverified",
                reason=f"the lock changed since its last results; {last.describe(pick(last))} "
                "(re-run the suite on the current lock)",
            )
        return Verdict(verdict="unverified", reason="resolved; no conformance results yet")
    chosen = max(gpus, key=lambda g: VERDICT_RANK[pick(g).verdict])
    verdict = _with_merged(pick(chosen), (pick(g) for g in gpus))
    if len(gpus) == 1:
        reason = f"on {chosen.gpu}: {verdict.reason}"
    else:
        others = ", ".join(f"{g.gpu}: {pick(g).verdict}" for g in gpus)
        reason = f"worst of {len(gpus)} GPUs ({others}); on {chosen.gpu}: {verdict.reason}"
    return replace(verdict, reason=reason)


def combination_use_verdicts(
    *,
    status: ResolveStatus,
    resolver_reason: str,
    gpus: Sequence[GpuVerdict],
    last: LastVerified | None = None,
) -> tuple[UseVerdict, ...]:
    """Per use, the combination's verdict: the resolver's, or the worst of its GPUs
    (*last*: the stale evidence its reason names when no GPU has run the current lock)."""
    return tuple(
        UseVerdict(
            use=u,
            verdict=_combined(status, resolver_reason, gpus, partial(_for_use, u), last),
        )
        for u in USES
    )


def combination_verdict(
    *,
    status: ResolveStatus,
    resolver_reason: str,
    gpus: Sequence[GpuVerdict],
    last: LastVerified | None = None,
) -> Verdict:
    """The combination's overall verdict from the resolver's status and its per-GPU verdicts."""
    return _combined(status, resolver_reason, gpus, lambda g: g.verdict, last)


@dataclass(frozen=True, kw_only=True)
class Judged:
    """A combination's verdicts as its runs give them (`judge`)."""

    gpus: tuple[GpuVerdict, ...]
    uses: tuple[UseVerdict, ...]
    verdict: Verdict
    last: LastVerified | None  # the stale evidence, judged as a combination's


def rejudged_run(run: Run, extra_runtime: Sequence[str] = ()) -> Run:
    """*run* with its verdicts made anew from its checks: a recorded verdict is not trusted."""
    uses = run_use_verdicts(run.checks, extra_runtime)
    return replace(run, uses=uses, verdict=overall(uses))


def judge(
    *, status: ResolveStatus, resolver_reason: str, runs: Sequence[Run], stale_runs: Sequence[Run]
) -> Judged:
    """Per GPU, per use and overall, the verdicts of a combination with these runs on its
    current lock and *stale_runs* on older ones: with runs, the worst use; without, one
    reason (the per-use ones may name several verdicts)."""
    gpus = gpu_verdicts(runs)
    last = last_verified(stale_runs)
    uses = combination_use_verdicts(
        status=status, resolver_reason=resolver_reason, gpus=gpus, last=last
    )
    verdict = (
        overall(uses)
        if gpus
        else combination_verdict(
            status=status, resolver_reason=resolver_reason, gpus=gpus, last=last
        )
    )
    return Judged(gpus=gpus, uses=uses, verdict=verdict, last=last)


def _finished(run: Run) -> datetime | None:
    """When *run* finished, in UTC; None when its time is unreadable or has no zone."""
    try:
        moment = datetime.fromisoformat(run.finished)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


def _age_key(run: Run) -> tuple[float, str, str]:
    moment = _finished(run)
    return (moment.timestamp() if moment else float("-inf"), run.finished, run.source_sha256)


def last_verified(stale_runs: Sequence[Run]) -> LastVerified | None:
    """The evidence of the older lock whose newest run finished last (None without runs)."""
    by_lock: dict[str, list[Run]] = {}
    for r in stale_runs:
        if r.lock_sha256 is not None:
            by_lock.setdefault(r.lock_sha256, []).append(r)
    if not by_lock:
        return None

    def newest(runs: Sequence[Run]) -> Run:
        return max(runs, key=_age_key)

    lock = max(by_lock, key=lambda sha: (*_age_key(newest(by_lock[sha])), sha))
    mine = by_lock[lock]
    gpus = gpu_verdicts(mine)
    latest = newest(mine)
    moment = _finished(latest)
    return LastVerified(
        lock_sha256=lock,
        date=moment.date().isoformat() if moment else latest.finished[:10],
        suite_version=latest.suite_version,
        verdict=combination_verdict(status="resolved", resolver_reason="", gpus=gpus),
        uses=combination_use_verdicts(status="resolved", resolver_reason="", gpus=gpus),
        runs=tuple(r.source for r in mine),
    )
