"""Rows for other platforms than glibc Linux are resolved, but get no image and no GPU job."""

from __future__ import annotations

import pytest

from envbuilder.ghmatrix import plan_jobs
from envbuilder.model import Combination, Resolution, ResolvedCombination, Status
from envbuilder.target import parse_cuda_build

RUNNER = ("self-hosted", "linux", "x64", "gpu")
SHA = "cd" * 32


def row(platform: str, cuda: str = "cu124") -> Combination:
    return Combination(
        id=f"py3.11-{cuda}-{platform}-torch2.5.1",
        python="3.11",
        cuda=parse_cuda_build(cuda) or "default",
        torch="2.5.1",
        xformers=None,
        platform=platform,
        runner=RUNNER,
    )


LINUX = row("manylinux_2_28_x86_64")
WINDOWS = row("win_amd64")
MACOS = row("macosx_14_0_arm64", "cpu")
MUSL = row("musllinux_1_2_x86_64", "cpu")


def resolution(*answers: tuple[Combination, Status]) -> Resolution:
    return Resolution(
        matrix="matrix.toml",
        matrix_sha256="0" * 64,
        combinations=tuple(
            ResolvedCombination(
                combination=c,
                status=status,
                reason="" if status == "resolved" else "no torch 2.5.1 wheel fits",
                lock_sha256=SHA if status == "resolved" else None,
            )
            for c, status in answers
        ),
    )


def test_a_mixed_plan_runs_the_linux_rows_and_says_why_the_others_do_not_run() -> None:
    answers = resolution(
        (LINUX, "resolved"), (WINDOWS, "resolved"), (MACOS, "resolved"), (MUSL, "unsatisfiable")
    )
    plan = plan_jobs([LINUX, WINDOWS, MACOS, MUSL], resolution=answers)
    assert [j.id for j in plan.jobs] == [LINUX.id]
    assert plan.builds()["include"] == [
        {
            "id": LINUX.id,
            "image": LINUX.image_tag(SHA),
            "runs-on": list(RUNNER),
            "artifact": f"image-{LINUX.id}",
        }
    ]
    skipped = {n.id: (n.status, n.reason) for n in plan.not_run}
    assert skipped[MUSL.id] == ("unsatisfiable", "no torch 2.5.1 wheel fits")  # the resolver's
    assert skipped[WINDOWS.id][0] == skipped[MACOS.id][0] == "skipped"
    assert "runs in place on a Windows GPU runner" in skipped[WINDOWS.id][1]
    assert "glibc Linux" in skipped[MACOS.id][1]
    assert plan.to_json()["not_run"][0] == {
        "id": WINDOWS.id,
        "status": "skipped",
        "reason": skipped[WINDOWS.id][1],
    }


@pytest.mark.parametrize("combination", [WINDOWS, MACOS, MUSL])
def test_without_a_resolution_a_non_linux_row_gets_no_job_either(combination: Combination) -> None:
    plan = plan_jobs([LINUX, combination], gpus={"h100": ["gpu-h100"], "l4": ["gpu-l4"]})
    assert [(j.id, j.gpu) for j in plan.jobs] == [(LINUX.id, "h100"), (LINUX.id, "l4")]
    assert [(n.id, n.status) for n in plan.not_run] == [(combination.id, "skipped")]
