"""The verdict rule (envbuilder.lockfile.verdicts), as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envbuilder.conformance._record import USES, Impl, Status, Use, Via, Workaround
from envbuilder.lockfile.model import (
    CheckOutcome,
    Run,
    UseVerdict,
    Verdict,
    VerdictName,
    WorkaroundChoice,
    use_verdict,
)
from envbuilder.lockfile.verdicts import (
    combination_use_verdicts,
    combination_verdict,
    gpu_verdicts,
    last_verified,
    overall,
    run_use_verdicts,
    run_verdict,
    torch_alone_id,
    use_verdict_of,
)
from envbuilder.lockfile.workarounds import cheapest, cost_text
from envbuilder.model import Status as ResolveStatus

TC: tuple[Use, ...] = ("training-compiled",)
IC: tuple[Use, ...] = ("inference-compiled",)


def check(
    name: str,
    status: Status = "pass",
    *,
    gate: bool = True,
    workaround: Workaround | None = None,
    uses: tuple[Use, ...] | None = None,
    covers: str | None = None,
    numbers: dict[str, float | int | str | bool] | None = None,
    via: Via | None = None,
    impl: Impl | None = None,
) -> CheckOutcome:
    """A check; ``uses=None`` makes it a results/1 check (untagged: every use)."""
    return CheckOutcome(
        name=name,
        group=name.split(".")[0],
        status=status,
        reason="" if status == "pass" else "why",
        gate=gate,
        impl=impl,
        workaround=workaround,
        numbers=numbers or {},
        duration_s=0.1,
        uses=uses,
        covers=covers,
        via=via,
    )


def fix(
    covered: str,
    workaround: Workaround,
    status: Status = "pass",
    *,
    uses: tuple[Use, ...] = TC,
    breaks: int | None = None,
    ms: float | None = None,
    per_step: float | None = None,
    suffix: str = "",
    via: Via | None = None,
    numbers: dict[str, float | int | str | bool] | None = None,
) -> CheckOutcome:
    """A results/2 workaround check re-running *covered*'s case."""
    numbers = dict(numbers or {})
    if breaks is not None:
        numbers["graph_breaks"] = breaks
    if ms is not None:
        numbers["step_ms"] = ms
    if per_step is not None:
        numbers["graph_breaks_per_step"] = per_step
    return check(
        f"{covered}.{workaround}{suffix}",
        status,
        gate=False,
        workaround=workaround,
        uses=uses,
        covers=covered,
        numbers=numbers,
        via=via,
    )


# ---- results/1: every gate check speaks for every use; workarounds cover their group -------

ENV = check("environment.import")
ATTN = check("attention.fp16")
COMPILE_FAIL = check("compile.dynamic.xformers", "fail")
SDPA_OK = check("compile.dynamic.sdpa", gate=False, workaround="sdpa-under-compile")
SDPA_FAIL = check("compile.dynamic.sdpa", "fail", gate=False, workaround="sdpa-under-compile")
DYNAMO_OK = check("compile.dynamo_disable", gate=False, workaround="dynamo-disable")
CUDART = ("nvidia-cuda-runtime-cu12==12.8.90",)


@pytest.mark.parametrize(
    ("checks", "extra_runtime", "verdict", "workarounds", "failing"),
    [
        # every direct gate check passed
        ([ENV, ATTN], (), "verified", (), ()),
        # skips neither pass nor fail
        ([ENV, check("attention.bf16", "skip")], (), "verified", (), ()),
        # non-gate failures do not count
        ([ENV, check("performance.x", "fail", gate=False)], (), "verified", (), ()),
        # nothing passed: no evidence
        ([], (), "unverified", (), ()),
        ([check("attention.bf16", "skip")], (), "unverified", (), ()),
        ([check("performance.x", gate=False)], (), "unverified", (), ()),
        # the resolver's added CUDA runtime is a workaround
        ([ENV, ATTN], CUDART, "verified-with-workaround", ("cuda-runtime:" + CUDART[0],), ()),
        # a failing direct check passed only by replacing xformers: xformers is unusable
        (
            [ENV, COMPILE_FAIL, SDPA_OK],
            (),
            "xformers-unusable",
            ("sdpa-under-compile",),
            ("compile.dynamic.xformers",),
        ),
        (
            [ENV, COMPILE_FAIL, SDPA_FAIL, DYNAMO_OK],
            (),
            "verified-with-workaround",
            ("dynamo-disable",),
            ("compile.dynamic.xformers",),
        ),
        # one that keeps xformers works: it is the workaround, the replacement an option
        (
            [ENV, COMPILE_FAIL, SDPA_OK, DYNAMO_OK],
            (),
            "verified-with-workaround",
            ("dynamo-disable",),
            ("compile.dynamic.xformers",),
        ),
        (
            [ENV, COMPILE_FAIL, SDPA_OK],
            CUDART,
            "xformers-unusable",
            ("sdpa-under-compile", "cuda-runtime:" + CUDART[0]),
            ("compile.dynamic.xformers",),
        ),
        # the workaround failed too
        ([ENV, COMPILE_FAIL, SDPA_FAIL], (), "broken", (), ("compile.dynamic.xformers",)),
        # a workaround of another group does not cover
        (
            [ENV, check("attention.fp16", "fail"), SDPA_OK],
            (),
            "broken",
            (),
            ("attention.fp16",),
        ),
        # error and timeout are failures
        ([ENV, check("attention.fp16", "error")], (), "broken", (), ("attention.fp16",)),
        ([ENV, check("compile.big", "timeout")], (), "broken", (), ("compile.big",)),
        # only the failures nobody worked around are named
        (
            [ENV, COMPILE_FAIL, SDPA_OK, check("attention.fp16", "fail")],
            (),
            "broken",
            (),
            ("attention.fp16",),
        ),
    ],
)
def test_results_1_checks_speak_for_every_use(
    checks: list[CheckOutcome],
    extra_runtime: tuple[str, ...],
    verdict: VerdictName,
    workarounds: tuple[str, ...],
    failing: tuple[str, ...],
) -> None:
    uses = run_use_verdicts(checks, extra_runtime)
    assert [u.use for u in uses] == list(USES)
    for u in uses:
        got = u.verdict
        assert (got.verdict, got.workarounds, got.failing_checks) == (
            verdict,
            workarounds,
            failing,
        )
        if verdict == "broken":
            for name in failing:
                assert name in got.reason
    assert run_verdict(checks, extra_runtime) == uses[0].verdict


# ---- results/2: per use ---------------------------------------------------------------------

GPU = check("environment.gpu", uses=USES)
EAGER = check("attention.xformers.fp16.bias.fwd", uses=("inference",))
TRAIN = check("attention.xformers.bf16.padding.fwd_bwd", uses=("training",))
FWD_C = check("compile.xformers.causal.fwd", uses=IC)
BIAS_C = "compile.xformers.bias.fwd_bwd"
PAD_C = "compile.xformers.padding.fwd_bwd"
BASE = [GPU, EAGER, TRAIN, FWD_C]


@pytest.mark.parametrize(
    ("checks", "use", "verdict", "workarounds", "failing"),
    [
        # a use with only environment gates is verified by them
        (BASE, "training-compiled", "verified", (), ()),
        (BASE, "inference", "verified", (), ()),
        # a use no gate check speaks for has no evidence
        ([EAGER, TRAIN], "training-compiled", "unverified", (), ()),
        # a failure counts only for the uses its check lists
        ([*BASE, check(BIAS_C, "fail", uses=TC)], "inference", "verified", (), ()),
        ([*BASE, check(BIAS_C, "fail", uses=TC)], "training-compiled", "broken", (), (BIAS_C,)),
        # invalid (could not tell right from wrong) is a failed gate, never a pass
        ([*BASE, check(BIAS_C, "invalid", uses=TC)], "training-compiled", "broken", (), (BIAS_C,)),
        # an invalid check alone is no evidence at all
        ([check(BIAS_C, "invalid", uses=TC)], "training-compiled", "unverified", (), ()),
        # an invalid check worked around on its own case is covered like a failure
        (
            [*BASE, check(BIAS_C, "invalid", uses=TC), fix(BIAS_C, "dynamo-disable")],
            "training-compiled",
            "verified-with-workaround",
            ("dynamo-disable",),
            (BIAS_C,),
        ),
        # a workaround covers only the check it names
        (
            [
                *BASE,
                check(BIAS_C, "fail", uses=TC),
                check(PAD_C, "fail", uses=TC),
                fix(BIAS_C, "dynamo-disable"),
            ],
            "training-compiled",
            "broken",
            (),
            (PAD_C,),
        ),
        (
            [
                *BASE,
                check(BIAS_C, "fail", uses=TC),
                check(PAD_C, "fail", uses=TC),
                fix(BIAS_C, "dynamo-disable"),
                fix(PAD_C, "dynamo-disable"),
            ],
            "training-compiled",
            "verified-with-workaround",
            ("dynamo-disable",),
            (BIAS_C, PAD_C),
        ),
        # one of them is passed only by replacing xformers: xformers is unusable for the use
        (
            [
                *BASE,
                check(BIAS_C, "fail", uses=TC),
                check(PAD_C, "fail", uses=TC),
                fix(BIAS_C, "dynamo-disable"),
                fix(PAD_C, "sdpa-under-compile"),
            ],
            "training-compiled",
            "xformers-unusable",
            ("dynamo-disable", "sdpa-under-compile"),
            (BIAS_C, PAD_C),
        ),
        # a workaround that failed on the case does not cover it, even if another check passed
        (
            [
                *BASE,
                check(BIAS_C, "fail", uses=TC),
                fix(BIAS_C, "dynamo-disable"),
                fix(BIAS_C, "dynamo-disable", "fail", suffix=".dynamic"),
            ],
            "training-compiled",
            "broken",
            (),
            (BIAS_C,),
        ),
        # a skipped workaround check is no evidence
        (
            [*BASE, check(BIAS_C, "fail", uses=TC), fix(BIAS_C, "dynamo-disable", "skip")],
            "training-compiled",
            "broken",
            (),
            (BIAS_C,),
        ),
        # the added CUDA runtime is named after the workarounds
        (
            [*BASE, check(BIAS_C, "error", uses=TC), fix(BIAS_C, "dynamo-disable")],
            "training-compiled",
            "verified-with-workaround",
            ("dynamo-disable", "cuda-runtime:" + CUDART[0]),
            (BIAS_C,),
        ),
    ],
)
def test_use_verdict(
    checks: list[CheckOutcome],
    use: Use,
    verdict: VerdictName,
    workarounds: tuple[str, ...],
    failing: tuple[str, ...],
) -> None:
    runtime = CUDART if any(w.startswith("cuda-runtime:") for w in workarounds) else ()
    got = use_verdict_of(checks, use, runtime)
    assert (got.verdict, got.workarounds, got.failing_checks) == (verdict, workarounds, failing)
    if verdict == "broken":
        assert all(name in got.reason for name in failing)


@pytest.mark.parametrize(
    ("fixes", "chosen"),
    [
        # the tier first: keeping xformers behind a break beats replacing it with none
        (
            [
                fix(BIAS_C, "dynamo-disable", breaks=2, per_step=3),
                fix(BIAS_C, "sdpa-under-compile", breaks=0, per_step=0),
            ],
            "dynamo-disable",
        ),
        # and keeping it with no break beats keeping it behind one
        (
            [
                fix(BIAS_C, "dynamo-disable", breaks=1, per_step=1),
                fix(BIAS_C, "mask-outside-compile", breaks=0, per_step=0),
            ],
            "mask-outside-compile",
        ),
        # one tier: fewer graph breaks per step
        (
            [
                fix(BIAS_C, "sdpa-instead", breaks=0, per_step=2),
                fix(BIAS_C, "sdpa-under-compile", breaks=0, per_step=0),
            ],
            "sdpa-under-compile",
        ),
        # step time is never ranked by: it is launch overhead; equal cost, the name decides
        (
            [
                fix(BIAS_C, "mask-outside-compile", breaks=0, per_step=0, ms=0.1),
                fix(BIAS_C, "mask-form", breaks=0, per_step=0, ms=90.0),
            ],
            "mask-form",
        ),
        (
            [
                fix(BIAS_C, "mask-form", breaks=0, per_step=0, ms=0.1),
                fix(BIAS_C, "mask-outside-compile", breaks=0, per_step=0, ms=90.0),
            ],
            "mask-form",
        ),
        # an unmeasured cost sorts after a measured one of its tier
        (
            [fix(BIAS_C, "sdpa-instead"), fix(BIAS_C, "sdpa-under-compile", per_step=5)],
            "sdpa-under-compile",
        ),
        # one that failed is never chosen, however cheap
        (
            [
                fix(BIAS_C, "mask-outside-compile", "fail", breaks=0, per_step=0),
                fix(BIAS_C, "sdpa-under-compile", breaks=9, per_step=9),
            ],
            "sdpa-under-compile",
        ),
        # several checks of one workaround on the case: its cost is the worst of them
        (
            [
                fix(BIAS_C, "sdpa-instead", breaks=0, per_step=0),
                fix(BIAS_C, "sdpa-instead", breaks=0, per_step=3, suffix=".model"),
                fix(BIAS_C, "sdpa-under-compile", breaks=1, per_step=1),
            ],
            "sdpa-under-compile",
        ),
    ],
)
def test_the_cheapest_working_workaround_is_listed_first(
    fixes: list[CheckOutcome], chosen: str
) -> None:
    checks = [GPU, check(BIAS_C, "fail", uses=TC), *fixes]
    got = use_verdict_of(checks, "training-compiled")
    assert got.options[0].workaround == chosen
    assert got.options[0].fixes == (BIAS_C,)
    # every one that works is listed, not only the cheapest
    working = {f.workaround for f in fixes} - {f.workaround for f in fixes if f.status != "pass"}
    assert {o.workaround for o in got.options} == working
    # the order the checks were recorded in does not matter
    assert use_verdict_of(list(reversed(checks)), "training-compiled") == got


def test_cheapest_of_nothing_is_none() -> None:
    assert cheapest([]) is None
    choice = WorkaroundChoice(
        check="c",
        workaround="dynamo-disable",
        evidence=("c.dynamo_disable",),
        graph_breaks=0,
        step_ms=1.0,
    )
    assert cheapest([choice]) == choice


def use_verdicts(*verdicts: VerdictName) -> tuple[UseVerdict, ...]:
    return tuple(
        UseVerdict(use=u, verdict=Verdict(verdict=v, reason=f"{v} because"))
        for u, v in zip(USES, verdicts, strict=True)
    )


@pytest.mark.parametrize(
    ("per_use", "expected", "named"),
    [
        (("verified",) * 4, "verified", ()),
        (("verified", "verified", "verified", "broken"), "broken", ("training-compiled",)),
        (
            ("verified", "verified-with-workaround", "verified", "verified-with-workaround"),
            "verified-with-workaround",
            ("inference-compiled", "training-compiled"),
        ),
        (("unverified", "broken", "verified", "verified"), "broken", ("inference-compiled",)),
        (("verified", "unverified", "verified", "verified"), "unverified", ("inference-compiled",)),
        (("unsatisfiable",) * 4, "unsatisfiable", ()),
    ],
)
def test_overall_is_the_worst_use(
    per_use: tuple[VerdictName, ...], expected: VerdictName, named: tuple[str, ...]
) -> None:
    got = overall(use_verdicts(*per_use))
    assert got.verdict == expected
    for use in named:
        assert use in got.reason
    if not named:  # all four agree: the shared verdict as it is
        assert got.reason == f"{expected} because"


def test_overall_names_every_workaround_of_its_uses() -> None:
    checks = [
        GPU,
        check(BIAS_C, "fail", uses=TC),
        fix(BIAS_C, "dynamo-disable", breaks=0, ms=1.0),
        check("compile.xformers.causal.fwd", "fail", uses=IC),
        fix("compile.xformers.causal.fwd", "dynamo-disable", uses=IC, breaks=1, ms=2.0),
        fix("compile.xformers.causal.fwd", "sdpa-under-compile", uses=IC, breaks=0, ms=1.0),
    ]
    got = run_verdict(checks, CUDART)
    assert got.verdict == "verified-with-workaround"
    assert got.workarounds == ("dynamo-disable", "cuda-runtime:" + CUDART[0])
    # every workaround verified on either use, cheapest first, each with what it fixed
    assert [(o.workaround, o.keeps_xformers, o.fixes) for o in got.options] == [
        ("dynamo-disable", True, (BIAS_C, "compile.xformers.causal.fwd")),
        ("sdpa-under-compile", False, ("compile.xformers.causal.fwd",)),
    ]
    assert [c.check for c in got.choices] == [BIAS_C, "compile.xformers.causal.fwd"]


def run(
    source: str,
    gpu: str,
    cc: str,
    *per_use: VerdictName,
    lock: str = "1" * 64,
    finished: str = "2026-11-20T00:01:00Z",
    suite: str = "2.0.0",
) -> Run:
    uses = use_verdicts(*(per_use if len(per_use) == 4 else per_use * 4))
    return Run(
        source=source,
        source_sha256="0" * 64,
        lock_sha256=lock,
        suite_version=suite,
        started="2026-11-20T00:00:00Z",
        finished=finished,
        gpu=gpu,
        compute_capability=cc,
        runner={},
        checks=(),
        uses=uses,
        verdict=overall(uses),
    )


def test_runs_that_disagree_on_one_gpu_are_kept_and_flagged() -> None:
    runs = [
        run("a.json", "H100", "9.0", "verified"),
        run("b.json", "H100", "9.0", "broken"),
        run("c.json", "A100", "8.0", "verified"),
    ]
    gpus = {g.gpu: g for g in gpu_verdicts(runs)}
    assert gpus["H100"].conflict and not gpus["A100"].conflict
    assert gpus["H100"].runs == ("a.json", "b.json")
    assert gpus["H100"].verdict.verdict == "broken"
    assert "conflicting" in gpus["H100"].verdict.reason


def test_runs_that_disagree_on_one_use_only_are_flagged_for_it() -> None:
    runs = [
        run("a.json", "H100", "9.0", "verified", "verified", "verified", "broken"),
        run("b.json", "H100", "9.0", "verified", "verified", "verified", "verified"),
    ]
    (gpu,) = gpu_verdicts(runs)
    assert gpu.conflict
    assert [u.verdict.verdict for u in gpu.uses] == ["verified"] * 3 + ["broken"]
    assert "conflicting" in use_verdict(gpu.uses, "training-compiled").reason
    assert "conflicting" not in use_verdict(gpu.uses, "inference").reason


@pytest.mark.parametrize(
    ("status", "per_gpu", "expected"),
    [
        ("unsatisfiable", [], "unsatisfiable"),
        ("error", [], "unsatisfiable"),
        ("resolved", [], "unverified"),
        ("resolved", ["verified"], "verified"),
        ("resolved", ["verified", "verified-with-workaround"], "verified-with-workaround"),
        ("resolved", ["verified", "unverified"], "unverified"),
        ("resolved", ["verified", "broken"], "broken"),
    ],
)
def test_combination_verdict_is_the_worst_gpu(
    status: ResolveStatus, per_gpu: list[VerdictName], expected: VerdictName
) -> None:
    runs = [run(f"{i}.json", f"GPU{i}", f"{i}.0", v) for i, v in enumerate(per_gpu)]
    gpus = gpu_verdicts(runs)
    got = combination_verdict(status=status, resolver_reason="no wheel", gpus=gpus)
    assert got.verdict == expected
    per_use = combination_use_verdicts(status=status, resolver_reason="no wheel", gpus=gpus)
    assert [u.verdict.verdict for u in per_use] == [expected] * 4
    if status != "resolved":
        assert "no wheel" in got.reason


def test_combination_use_verdicts_take_each_use_from_its_worst_gpu() -> None:
    runs = [
        run("a.json", "H100", "9.0", "verified", "verified", "verified", "broken"),
        run("b.json", "A100", "8.0", "verified", "unverified", "verified", "verified"),
    ]
    per_use = combination_use_verdicts(
        status="resolved", resolver_reason="", gpus=gpu_verdicts(runs)
    )
    assert [u.verdict.verdict for u in per_use] == ["verified", "unverified", "verified", "broken"]
    assert "on H100" in use_verdict(per_use, "training-compiled").reason
    assert overall(per_use).verdict == "broken"


OLD, OLDER = "a" * 64, "b" * 64


@pytest.mark.parametrize(
    ("stale", "expected"),
    [
        # (source, gpu, verdict, lock, finished, suite) -> (lock, date, suite, verdict, runs)
        ([], None),
        (
            [("a.json", "H100", "verified", OLD, "2026-11-12T10:04:00Z", "2.0.0")],
            (OLD, "2026-11-12", "2.0.0", "verified", ("a.json",)),
        ),
        (  # of two older locks, the one whose newest run finished last
            [
                ("old.json", "H100", "verified", OLD, "2026-11-12T10:04:00Z", "2.0.0"),
                ("older.json", "H100", "broken", OLDER, "2026-11-05T10:04:00Z", "1.0.0"),
            ],
            (OLD, "2026-11-12", "2.0.0", "verified", ("old.json",)),
        ),
        (  # … compared as times, not as text: 23:00-05:00 is the next day in UTC
            [
                ("old.json", "H100", "verified", OLD, "2026-11-12T23:00:00Z", "2.0.0"),
                ("older.json", "H100", "broken", OLDER, "2026-11-12T23:00:00-05:00", "1.0.0"),
            ],
            (OLDER, "2026-11-13", "1.0.0", "broken", ("older.json",)),
        ),
        (  # the runs of that lock are judged as a combination's: the worst GPU
            [
                ("h.json", "H100", "verified", OLD, "2026-11-12T10:04:00Z", "2.0.0"),
                ("a.json", "A100", "broken", OLD, "2026-11-11T10:04:00Z", "2.0.0"),
            ],
            (OLD, "2026-11-12", "2.0.0", "broken", ("a.json", "h.json")),
        ),
    ],
)
def test_last_verified_is_the_newest_older_lock(
    stale: list[tuple[str, str, VerdictName, str, str, str]],
    expected: tuple[str, str, str, VerdictName, tuple[str, ...]] | None,
) -> None:
    runs = [
        run(src, gpu, gpu, verdict, lock=lock, finished=finished, suite=suite)
        for src, gpu, verdict, lock, finished, suite in stale
    ]
    last = last_verified(runs)
    if expected is None:
        assert last is None
        return
    assert last is not None
    assert (last.lock_sha256, last.date, last.suite_version, last.verdict.verdict) == expected[:4]
    assert sorted(last.runs) == sorted(expected[4])


@pytest.mark.parametrize(
    ("current", "stale", "expected", "reason"),
    [
        # runs on the current lock decide; stale evidence is not counted and not named
        (["verified"], [], "verified", "on H100: verified because"),
        (["verified"], ["broken"], "verified", "on H100: verified because"),
        (["broken"], ["verified"], "broken", "on H100: broken because"),
        # no runs on the current lock: unverified, whatever the older lock said, and said so
        ([], ["verified"], "unverified", "last verified 2026-11-12 on lock aaaaaaaaaaaa: verified"),
        ([], ["broken"], "unverified", "last verified 2026-11-12 on lock aaaaaaaaaaaa: broken"),
        ([], [], "unverified", "no conformance results yet"),
    ],
)
def test_a_combination_with_only_stale_evidence_is_unverified_for_every_use(
    current: list[VerdictName], stale: list[VerdictName], expected: VerdictName, reason: str
) -> None:
    gpus = gpu_verdicts([run(f"c{i}.json", "H100", "9.0", v) for i, v in enumerate(current)])
    old = [
        run(f"s{i}.json", "H100", "9.0", v, lock=OLD, finished="2026-11-12T10:04:00Z")
        for i, v in enumerate(stale)
    ]
    last = last_verified(old)
    per_use = combination_use_verdicts(status="resolved", resolver_reason="", gpus=gpus, last=last)
    assert [u.verdict.verdict for u in per_use] == [expected] * 4
    assert all(reason in u.verdict.reason for u in per_use)
    got = combination_verdict(status="resolved", resolver_reason="", gpus=gpus, last=last)
    assert got.verdict == expected and reason in got.reason


def test_the_last_verified_reason_of_a_use_names_that_use_s_verdict_then() -> None:
    old = [
        run("s.json", "H100", "9.0", "verified", "verified", "verified", "broken", lock=OLD),
    ]
    per_use = combination_use_verdicts(
        status="resolved", resolver_reason="", gpus=(), last=last_verified(old)
    )
    assert [u.verdict.verdict for u in per_use] == ["unverified"] * 4
    assert use_verdict(per_use, "training").reason.endswith(
        "on lock aaaaaaaaaaaa: verified (re-run the suite on the current lock)"
    )
    assert "on lock aaaaaaaaaaaa: broken" in use_verdict(per_use, "training-compiled").reason


def test_agreeing_runs_of_one_gpu_are_described_by_the_one_with_most_evidence() -> None:
    """A --quick and a full run that agree: the reason counts the full run's checks,
    whichever of them comes first."""

    def checked(source: str, count: int) -> Run:
        checks = tuple(check(f"attention.sdpa.c{i}", uses=("training",)) for i in range(count))
        uses = run_use_verdicts(checks)
        return replace(run(source, "H200", "9.0", "verified"), checks=checks, uses=uses)

    for runs in (
        [checked("a.quick.json", 2), checked("b.json", 7)],
        [checked("b.json", 7), checked("a.quick.json", 2)],
    ):
        (gpu,) = gpu_verdicts(runs)
        assert not gpu.conflict
        assert use_verdict(gpu.uses, "training").reason == "all 7 gate checks passed"


def test_a_quick_run_beside_a_full_one_that_failed_more_is_no_conflict() -> None:
    """The full run ran checks the --quick one did not, and one of them failed: the verdicts
    differ, but no check said two things, so the worst stands and nothing is flagged."""

    def ran(source: str, checks: tuple[CheckOutcome, ...]) -> Run:
        uses = run_use_verdicts(checks)
        return replace(
            run(source, "H200", "9.0", "verified"), checks=checks, uses=uses, verdict=overall(uses)
        )

    shared = (check("attention.sdpa.c0", uses=TC), check("attention.sdpa.c1", uses=TC))
    quick = ran("a.quick.json", shared)
    full = ran("b.json", (*shared, check("compile.xformers.c2", "fail", uses=TC)))
    assert quick.verdict.verdict != full.verdict.verdict
    (gpu,) = gpu_verdicts([quick, full])
    assert not gpu.conflict
    assert use_verdict(gpu.uses, "training-compiled").verdict == full.verdict.verdict
    assert "conflicting" not in use_verdict(gpu.uses, "training-compiled").reason
    # the same check passing in one run and failing in the other is a conflict
    flaky = ran("c.json", (check("attention.sdpa.c0", "fail", uses=TC), shared[1]))
    (gpu,) = gpu_verdicts([quick, flaky])
    assert gpu.conflict
    assert "conflicting" in use_verdict(gpu.uses, "training-compiled").reason


# ---- workarounds that keep xformers and those that replace it ------------------------------

KEEP: Workaround = "dynamo-disable"  # the user's code still calls xformers
REPLACE: Workaround = "sdpa-under-compile"  # the user's code calls SDPA instead


@pytest.mark.parametrize(
    ("working", "verdict", "workarounds"),
    [
        # every failing check has a workaround that keeps xformers
        ({BIAS_C: [KEEP], PAD_C: [KEEP]}, "verified-with-workaround", (KEEP,)),
        # ... and a replacement that also works is listed, not chosen
        ({BIAS_C: [KEEP, REPLACE], PAD_C: [KEEP]}, "verified-with-workaround", (KEEP,)),
        # one failing check passes only without xformers: xformers is unusable for the use
        ({BIAS_C: [KEEP], PAD_C: [REPLACE]}, "xformers-unusable", (KEEP, REPLACE)),
        ({BIAS_C: [REPLACE], PAD_C: [REPLACE]}, "xformers-unusable", (REPLACE,)),
        ({BIAS_C: ["sdpa-instead"], PAD_C: [KEEP]}, "xformers-unusable", (KEEP, "sdpa-instead")),
        # a failing check with no working workaround at all: broken, whatever else works
        ({BIAS_C: [REPLACE], PAD_C: []}, "broken", ()),
        ({BIAS_C: [KEEP], PAD_C: []}, "broken", ()),
    ],
)
def test_keeping_xformers_or_replacing_it(
    working: dict[str, list[Workaround]], verdict: VerdictName, workarounds: tuple[str, ...]
) -> None:
    checks = [*BASE, check(BIAS_C, "fail", uses=TC), check(PAD_C, "fail", uses=TC)]
    for covered, names in working.items():
        checks += [fix(covered, n, breaks=1 if n == KEEP else 0, ms=2.0) for n in names]
    got = use_verdict_of(checks, "training-compiled")
    assert (got.verdict, got.workarounds) == (verdict, workarounds)
    # every workaround that works anywhere is listed, with whether it keeps xformers
    listed = {(o.workaround, o.keeps_xformers) for o in got.options}
    assert listed == {(n, n == KEEP) for names in working.values() for n in names}
    if verdict == "xformers-unusable":
        assert "only without xformers" in got.reason
        assert got.failing_checks == (BIAS_C, PAD_C)


def test_xformers_unusable_ranks_between_a_workaround_and_no_evidence() -> None:
    order: list[VerdictName] = ["verified-with-workaround", "xformers-unusable", "unverified"]
    assert overall(use_verdicts("verified", *order)).verdict == "unverified"
    assert overall(use_verdicts("verified", "verified", *order[:2])).verdict == order[1]


@pytest.mark.parametrize(
    ("combination", "alone"),
    [
        ("py3.12-cu130-torch2.11.0-xformers0.0.35-cudart", "py3.12-cu130-torch2.11.0"),
        ("py3.11-cu124-torch2.5.1-xformers0.0.28.post3", "py3.11-cu124-torch2.5.1"),
        ("py3.12-cu130-torch2.11.0", None),
    ],
)
def test_the_torch_alone_combination(combination: str, alone: str | None) -> None:
    assert torch_alone_id(combination) == alone


def test_a_workaround_outside_the_suites_vocabulary_is_refused_when_read() -> None:
    """The lockfile's workaround names are the suite's (`KEEPS_XFORMERS` says which keep
    xformers): a name the suite never made cannot be ranked as keeping or replacing it."""
    data = {"name": f"{BIAS_C}.x", "group": "compile", "status": "pass"}
    assert CheckOutcome.from_json({**data, "workaround": "dynamo-disable"}).workaround == KEEP
    with pytest.raises(ValueError, match="workaround 'something-new' is not one of"):
        CheckOutcome.from_json({**data, "workaround": "something-new"})


# ---- per call path: what the row pins, and the libraries the suite reached it through ------

INF: tuple[Use, ...] = ("inference",)
MASK = "masks.xformers.bool4d_b11n.fp16"
DIFFUSERS: dict[str, float | int | str | bool] = {"diffusers": "0.42.1"}


def through_diffusers(
    name: str,
    status: Status = "pass",
    *,
    gate: bool = True,
    uses: tuple[Use, ...] | None = None,
) -> CheckOutcome:
    """A check that reached xformers through diffusers' xformers backend."""
    return check(
        name, status, gate=gate, uses=uses, via="diffusers", impl="xformers", numbers=DIFFUSERS
    )


DIRECT_OK = [
    GPU,
    EAGER,
    check("attention.xformers.fp16.none.fwd", uses=INF),
    through_diffusers("masks.xformers.bool2d.fp16", uses=INF),
]


@pytest.mark.parametrize(
    ("extra", "verdict", "advisory"),
    [
        # its only failure is through diffusers: verified, with diffusers' own verdict beside
        (
            [
                through_diffusers(MASK, "fail", uses=INF),
                fix(MASK, "sdpa-instead", uses=INF, via="diffusers", numbers=DIFFUSERS),
            ],
            "verified",
            "xformers-unusable",
        ),
        # a keep-xformers fix of diffusers' call (the mask form it converts right)
        (
            [
                through_diffusers(MASK, "fail", uses=INF),
                fix(MASK, "mask-form", uses=INF, via="diffusers", breaks=0),
            ],
            "verified",
            "verified-with-workaround",
        ),
        # nothing fixes it: diffusers' backend is broken, the kernels are not
        ([through_diffusers(MASK, "fail", uses=INF)], "verified", "broken"),
        # diffusers passing says verified for it too
        ([through_diffusers(MASK, uses=INF)], "verified", "verified"),
        # a direct failure is the row's, whatever diffusers says
        (
            [check("attention.xformers.fp16.bias.fwd", "fail", uses=INF), through_diffusers(MASK)],
            "broken",
            "verified",
        ),
    ],
)
def test_a_library_the_row_does_not_pin_gets_an_advisory_not_the_verdict(
    extra: list[CheckOutcome], verdict: VerdictName, advisory: VerdictName
) -> None:
    got = use_verdict_of([*DIRECT_OK, *extra], "inference")
    assert got.verdict == verdict
    assert all(not name.startswith("masks.") for name in got.failing_checks)
    (item,) = got.advisories
    assert (item.via, item.version, item.verdict.verdict) == ("diffusers", "0.42.1", advisory)
    if advisory != "verified":
        assert item.name == "diffusers 0.42.1 xformers backend"
        assert item.verdict.failing_checks == (MASK,)


def test_an_advisory_keeps_the_librarys_info_checks_as_who_is_hit() -> None:
    unaligned = through_diffusers(
        "model.diffusers.qwenimage.xformers.unaligned_mask", "fail", gate=False, uses=()
    )
    got = use_verdict_of(
        [*DIRECT_OK, through_diffusers(MASK, "fail", uses=INF), unaligned], "inference"
    )
    assert [i.name for i in got.advisories[0].info] == [unaligned.name]
    # an info check of the row's own path is no advisory's
    alone = use_verdict_of([*DIRECT_OK, check("performance.x", "fail", gate=False)], "inference")
    assert [i.name for a in alone.advisories for i in a.info] == []


SUITE_ERROR: dict[str, float | int | str | bool] = {
    "fault_component": "suite",
    "fault_evidence": "raised in the suite's own code at checks_model.py:205",
}


@pytest.mark.parametrize(
    "checks",
    [
        # a direct gate check that the suite's own code broke
        [*BASE, check(BIAS_C, "error", uses=TC, numbers=SUITE_ERROR)],
        # the only workaround check of a failure, broken by the suite: no evidence either way
        [
            *BASE,
            check(PAD_C, "fail", uses=TC),
            fix(PAD_C, "dynamo-disable", "error", numbers=SUITE_ERROR),
        ],
        # beside a workaround that passed: it still works
        [
            *BASE,
            check(PAD_C, "fail", uses=TC),
            fix(PAD_C, "dynamo-disable"),
            fix(PAD_C, "dynamo-disable", "error", suffix=".model", numbers=SUITE_ERROR),
        ],
    ],
)
def test_a_suite_error_changes_no_verdict(checks: list[CheckOutcome]) -> None:
    errors = [c for c in checks if c.suite_error]
    assert errors
    without = [c for c in checks if not c.suite_error]
    got = use_verdict_of(checks, "training-compiled")
    expected = use_verdict_of(without, "training-compiled")
    assert (got.verdict, got.failing_checks, got.workarounds) == (
        expected.verdict,
        expected.failing_checks,
        expected.workarounds,
    )
    assert got.suite_errors == tuple(sorted(c.name for c in errors))
    assert not set(got.suite_errors) & set(got.failing_checks)


NOBREAKS = "compile.xformers.causal.static.nobreaks.fp16.forward"


@pytest.mark.parametrize(
    ("fixes", "verdict"),
    [
        # dynamo-disable passed with the very break the check failed for: no fix
        ([fix(NOBREAKS, "dynamo-disable", uses=IC, breaks=1)], "broken"),
        # an unmeasured break proves nothing either
        ([fix(NOBREAKS, "dynamo-disable", uses=IC)], "broken"),
        # with none, it is one
        ([fix(NOBREAKS, "mask-outside-compile", uses=IC, breaks=0)], "verified-with-workaround"),
        # only replacing xformers leaves no break: xformers is unusable for it
        (
            [
                fix(NOBREAKS, "dynamo-disable", uses=IC, breaks=1),
                fix(NOBREAKS, "sdpa-under-compile", uses=IC, breaks=0),
            ],
            "xformers-unusable",
        ),
    ],
)
def test_a_nobreaks_failure_is_covered_only_by_a_workaround_without_a_break(
    fixes: list[CheckOutcome], verdict: VerdictName
) -> None:
    checks = [*BASE, check(NOBREAKS, "fail", uses=IC, numbers={"graph_breaks": 1}), *fixes]
    got = use_verdict_of(checks, "inference-compiled")
    assert got.verdict == verdict
    assert "dynamo-disable" not in {o.workaround for o in got.options}


@pytest.mark.parametrize(
    ("numbers", "covered", "said"),
    [
        # measured per call and per step, and the fullgraph it gives up, as recorded
        (
            {
                "graph_breaks": 1,
                "graph_breaks_per_call": 1,
                "graph_breaks_per_step": 3,
                "drops_fullgraph": True,
            },
            "compile.xformers.bias.fwd_bwd",
            "1 graph break per call, 3 per step, drops fullgraph=True",
        ),
        # a suite before 3.0: the check's own breaks, on a case compiled with fullgraph
        (
            {"graph_breaks": 1},
            "compile.xformers.bias.static.fullgraph.fp16.backward",
            "1 graph break, drops fullgraph=True",
        ),
        ({"graph_breaks": 2}, "compile.xformers.bias.fwd_bwd", "2 graph breaks"),
        # recorded false wins over the name
        (
            {"graph_breaks": 1, "drops_fullgraph": False},
            "compile.xformers.bias.static.fullgraph.fp16.backward",
            "1 graph break",
        ),
    ],
)
def test_a_workarounds_cost_says_breaks_per_call_and_step_and_a_dropped_fullgraph(
    numbers: dict[str, float | int | str | bool], covered: str, said: str
) -> None:
    checks = [GPU, check(covered, "fail", uses=TC), fix(covered, "dynamo-disable", numbers=numbers)]
    got = use_verdict_of(checks, "training-compiled")
    assert got.verdict == "verified-with-workaround"
    assert cost_text(got.options[0]) == said
    assert said in got.reason


def test_a_check_without_a_via_takes_it_from_its_name() -> None:
    """Checks of compat/3 lockfiles and results/2 files record no call path."""
    base = {"group": "masks", "status": "pass", "gate": True, "uses": ["inference"]}
    assert CheckOutcome.from_json({**base, "name": MASK}).via == "diffusers"
    assert CheckOutcome.from_json({**base, "name": "attention.x"}).via is None
    assert CheckOutcome.from_json({**base, "name": "attention.x", "via": "diffusers"}).via == (
        "diffusers"
    )
    with pytest.raises(ValueError, match="via"):
        CheckOutcome.from_json({**base, "name": "attention.x", "via": "keras"})


@pytest.mark.parametrize(
    ("numbers", "fault"),
    [
        ({}, "undecided"),
        # a component a suite before 3.0 read from the message, with no experiment: no finding
        ({"fault_component": "torch"}, "undecided"),
        ({"fault_component": "diffusers", "fault_evidence": "exact attention: 0.169"}, "diffusers"),
        ({"fault_component": "undecided", "fault_evidence": ""}, "undecided"),
    ],
)
def test_who_is_at_fault_is_an_experiments_finding(
    numbers: dict[str, float | int | str | bool], fault: str
) -> None:
    got = check(MASK, "fail", numbers=numbers)
    assert got.fault == fault
    assert (got.fault_evidence is None) == (fault == "undecided")
