"""Choosing combinations: GPU names, CUDA spellings, order, and the arch-list prediction."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.errors import InputError
from envbuilder.lockfile.gpus import arch_covers, compute_capability
from envbuilder.lockfile.model import USES, CompatLock, use_verdict
from envbuilder.lockfile.query import Query, normalise_cuda, select

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize(
    ("gpu", "cc"),
    [
        ("sm90", "9.0"),
        ("sm_90", "9.0"),
        ("SM86", "8.6"),
        ("sm100", "10.0"),
        ("9.0", "9.0"),
        ("H100", "9.0"),
        ("h200", "9.0"),
        ("A100", "8.0"),
        ("L40S", "8.9"),
        ("RTX 4090", "8.9"),
        ("Quadro X9", "7.7"),  # not in the table: taken from what a runner recorded
    ],
)
def test_gpu_names(gpu: str, cc: str) -> None:
    assert compute_capability(gpu, [("NVIDIA Quadro X9", "7.7")]) == cc


def test_unknown_gpu_is_bad_input() -> None:
    with pytest.raises(InputError, match="unknown GPU 'Z9'"):
        compute_capability("Z9")


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("8.0 9.0", "9.0", True),
        ("8.0;9.0", "8.6", False),
        ("8.0 8.6+PTX", "9.0", True),
        ("9.0+PTX", "8.0", False),
        ("7.5 8.0", "10.0", False),
    ],
)
def test_arch_list_coverage(arch: str, cc: str, runs: bool) -> None:
    assert arch_covers(arch, cc) is runs


@pytest.mark.parametrize(
    ("given", "normal"), [("12.1", "cu121"), ("cu124", "cu124"), ("CPU", "cpu"), ("13.0", "cu130")]
)
def test_cuda_spellings(given: str, normal: str) -> None:
    assert normalise_cuda(given) == normal


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            Query(python="3.11"),
            [
                ("py3.11-default-torch2.5.1-xformers0.0.28.post3", "verified"),
                ("py3.11-default-torch2.6.0-xformers0.0.29.post3", "verified-with-workaround"),
                ("py3.11-default-torch2.9.0", "unverified"),
            ],
        ),
        (
            Query(torch="2.4"),
            [
                ("py3.10-default-torch2.4.1-xformers0.0.28.post1", "broken"),
                ("py3.13-default-torch2.4.1-xformers0.0.28.post1", "unsatisfiable"),
            ],
        ),
        (
            Query(cuda="12.4", xformers="0.0.30"),
            [
                ("py3.12-default-torch2.7.0-xformers0.0.30-cudart", "verified-with-workaround"),
            ],
        ),
        # on an H200 (sm_90): H100 runs count, A100-only results do not
        (
            Query(python="3.10", gpu="H200"),
            [
                (
                    "py3.10-default-torch2.4.1-xformers0.0.28.post1",
                    "broken",  # predicted: xformers built for 8.0 only
                ),
            ],
        ),
        (
            Query(python="3.11", gpu="sm80", torch="2.6"),
            [
                ("py3.11-default-torch2.6.0-xformers0.0.29.post3", "unverified"),
            ],
        ),
        (Query(python="3.9"), []),
    ],
)
def test_select(compat: CompatLock, query: Query, expected: list[tuple[str, str]]) -> None:
    assert [(m.entry.id, m.verdict.verdict) for m in select(compat, query)] == expected


PER_USE = "py3.12-default-torch2.10.0-xformers0.0.34"
CHEAPEST = "py3.12-default-torch2.11.0-xformers0.0.35"
CUDART = "py3.12-default-torch2.7.0-xformers0.0.30-cudart"
CONFLICT = "py3.12-default-torch2.8.0-xformers0.0.32.post2"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # overall: the worst use decides
        (
            Query(python="3.12"),
            [
                (CHEAPEST, "verified-with-workaround"),
                (CUDART, "verified-with-workaround"),
                (PER_USE, "broken"),
                (CONFLICT, "broken"),
            ],
        ),
        # by one use: that use's verdict decides the order and is the one shown
        (
            Query(python="3.12", use="training"),
            [
                (CHEAPEST, "verified"),
                (PER_USE, "verified"),
                (CUDART, "verified-with-workaround"),
                (CONFLICT, "broken"),
            ],
        ),
        (
            Query(python="3.12", use="training-compiled"),
            [
                (CHEAPEST, "verified-with-workaround"),
                (CUDART, "verified-with-workaround"),
                (PER_USE, "broken"),
                (CONFLICT, "broken"),
            ],
        ),
        (
            Query(python="3.12", torch="2.10", use="inference-compiled"),
            [(PER_USE, "verified-with-workaround")],
        ),
        # results/1 evidence speaks for every use
        (
            Query(python="3.11", torch="2.6", use="training-compiled"),
            [("py3.11-default-torch2.6.0-xformers0.0.29.post3", "verified-with-workaround")],
        ),
        # per use on a GPU: H100 runs count for an H200; none on an A100
        (
            Query(python="3.12", torch="2.10", gpu="H200", use="training-compiled"),
            [(PER_USE, "broken")],
        ),
        (
            Query(python="3.12", torch="2.10", gpu="A100", use="training"),
            [(PER_USE, "unverified")],
        ),
    ],
)
def test_select_by_use(compat: CompatLock, query: Query, expected: list[tuple[str, str]]) -> None:
    matches = select(compat, query)
    assert [(m.entry.id, m.verdict.verdict) for m in matches] == expected
    for m in matches:
        assert m.use == query.use
        assert [u.use for u in m.uses] == list(USES)
        if query.use is not None:
            assert use_verdict(m.uses, query.use) == m.verdict


def test_the_workaround_named_for_a_use_is_the_one_measured_for_it(compat: CompatLock) -> None:
    (match,) = select(compat, Query(torch="2.11", use="inference-compiled"))
    (choice,) = match.verdict.choices
    assert (choice.workaround, choice.graph_breaks, choice.step_ms) == ("dynamo-disable", 0, 1.2)
    (match,) = select(compat, Query(torch="2.11", use="training-compiled"))
    assert match.verdict.workarounds == ("sdpa-under-compile",)
