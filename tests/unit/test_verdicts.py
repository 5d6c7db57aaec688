"""The verdict rule (envbuilder.lockfile.verdicts), as a table."""

from __future__ import annotations

import pytest

from envbuilder.lockfile.model import CheckOutcome, Run, Verdict
from envbuilder.lockfile.verdicts import combination_verdict, gpu_verdicts, run_verdict


def check(
    name: str, status: str = "pass", *, gate: bool = True, workaround: str | None = None
) -> CheckOutcome:
    return CheckOutcome(
        name=name,
        group=name.split(".")[0],
        status=status,
        reason="" if status == "pass" else "why",
        gate=gate,
        impl=None,
        workaround=workaround,
        numbers={},
        duration_s=0.1,
    )


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
        # a failing direct check covered by a passing workaround of the same group
        (
            [ENV, COMPILE_FAIL, SDPA_OK],
            (),
            "verified-with-workaround",
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
        (
            [ENV, COMPILE_FAIL, SDPA_OK],
            CUDART,
            "verified-with-workaround",
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
def test_run_verdict(
    checks: list[CheckOutcome],
    extra_runtime: tuple[str, ...],
    verdict: str,
    workarounds: tuple[str, ...],
    failing: tuple[str, ...],
) -> None:
    got = run_verdict(checks, extra_runtime)
    assert (got.verdict, got.workarounds, got.failing_checks) == (verdict, workarounds, failing)
    if verdict == "broken":
        for name in failing:
            assert name in got.reason


def run(source: str, gpu: str, cc: str, verdict: str) -> Run:
    return Run(
        source=source,
        source_sha256="0" * 64,
        suite_version="1.0.0",
        started="2026-11-20T00:00:00Z",
        finished="2026-11-20T00:01:00Z",
        gpu=gpu,
        compute_capability=cc,
        runner={},
        checks=(),
        verdict=Verdict(verdict=verdict, reason=f"{verdict} because"),  # type: ignore[arg-type]
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
    status: str, per_gpu: list[str], expected: str
) -> None:
    runs = [run(f"{i}.json", f"GPU{i}", f"{i}.0", v) for i, v in enumerate(per_gpu)]
    got = combination_verdict(status=status, resolver_reason="no wheel", gpus=gpu_verdicts(runs))
    assert got.verdict == expected
    if status != "resolved":
        assert "no wheel" in got.reason
