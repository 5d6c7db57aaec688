"""Decisions against a fake evidence source: no server, just the facts each case needs."""

from __future__ import annotations

import pytest

from envbuilder.index.simple import DistributionFile
from envbuilder.model import BuildRecord, Combination, IndexSpec
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.target import CudaTag, parse_cuda_build
from tests.support.evidence import DEFAULT, FakeEvidence, wheel

TORCH = wheel("torch", "2.4.1")
XFORMERS = wheel("xformers", "0.0.28.post1", "cp311-cp311-manylinux_2_28_x86_64")
MATCHING = BuildRecord(torch="2.4.1+cu121", cuda=CudaTag(12, 1), arch_list="8.0")


RUNTIME_TAG = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
PLACEHOLDER = "py3-none-any"  # what the index holds under a runtime name it does not use


def runtime_wheels(project: str, *versions: str, tag: str = RUNTIME_TAG) -> list[DistributionFile]:
    return [wheel(project.replace("-", "_"), v, tag) for v in versions]


def evidence(
    *,
    torch_cuda: str = "12.1.105",
    xformers_requires: str = "torch==2.4.1",
    record: BuildRecord | None = MATCHING,
    runtimes: dict[str, list[DistributionFile]] | None = None,
    broken: bool = False,
) -> FakeEvidence:
    """The index as the public one lays it out: CUDA 13's runtime is ``nvidia-cuda-runtime``,
    ``nvidia-cuda-runtime-cu13`` only a placeholder release."""
    if runtimes is None:
        runtimes = {
            "nvidia-cuda-runtime-cu13": runtime_wheels(
                "nvidia-cuda-runtime-cu13", "0.0.0a0", tag=PLACEHOLDER
            )
        }
    torch_pin = (
        f"nvidia-cuda-runtime-cu12=={torch_cuda}"
        if torch_cuda.startswith("12.")
        else f"cuda-toolkit[cudart]=={torch_cuda}"
    )
    return FakeEvidence(
        files={"torch": [TORCH], "xformers": [XFORMERS], **runtimes},
        requires={
            TORCH.filename: [torch_pin, "filelock"],
            XFORMERS.filename: [xformers_requires, "numpy"],
        },
        records={XFORMERS.filename: record} if record else {},
        broken=broken,
    )


CUDA13_BUILD = BuildRecord(torch="2.4.1", cuda=CudaTag(13, 0), arch_list=None)
CUDA13_RUNTIMES = {
    "nvidia-cuda-runtime-cu13": runtime_wheels(
        "nvidia-cuda-runtime-cu13", "0.0.0a0", tag=PLACEHOLDER
    ),
    "nvidia-cuda-runtime": [
        *runtime_wheels("nvidia-cuda-runtime", "0.0.0a0", tag=PLACEHOLDER),
        *runtime_wheels("nvidia-cuda-runtime", "13.0.48", "13.0.96", "13.1.80"),
        *runtime_wheels("nvidia-cuda-runtime", "13.0.99", tag="py3-none-manylinux_2_28_aarch64"),
    ],
}


def combination(cuda: str = "cu121", *, add_cuda_runtime: bool = False) -> Combination:
    return Combination(
        id=f"py3.11-{cuda}-torch2.4.1-xformers0.0.28.post1",
        python="3.11",
        cuda=parse_cuda_build(cuda) or "default",
        torch="2.4.1",
        xformers="0.0.28.post1",
        add_cuda_runtime=add_cuda_runtime,
    )


def run(c: Combination, source: FakeEvidence) -> Decision:
    indexes = {"default": IndexSpec(name="default", url=None)}
    return decide(c, source, indexes=indexes, default_index_url=DEFAULT)


@pytest.mark.parametrize(
    ("c", "source", "status", "says"),
    [
        (combination(), evidence(), "decided", ""),
        (combination("default"), evidence(), "decided", ""),
        (combination("cu124"), evidence(), "unsatisfiable", "no torch 2.4.1 build for cu124: torch-2.4.1-cp311-cp311-manylinux_2_28_x86_64.whl is CUDA 12.1"),
        (combination("cpu"), evidence(), "unsatisfiable", "a CUDA 12.1 build"),
        (combination(), evidence(xformers_requires="torch==2.3.0"), "unsatisfiable", "requires torch==2.3.0 (its Requires-Dist), which torch 2.4.1 does not satisfy"),
        (combination(), evidence(record=CUDA13_BUILD, runtimes=CUDA13_RUNTIMES), "unsatisfiable", "needs libcudart.so.13, which this torch does not bring; set add-cuda-runtime = true to add nvidia-cuda-runtime==13.0.96"),
        (combination(add_cuda_runtime=True), evidence(record=CUDA13_BUILD), "unsatisfiable", "no CUDA 13.0 runtime wheel for cp311 on manylinux_2_28_x86_64 on the default index"),
        (combination(), evidence(broken=True), "error", "HTTP 503"),
    ],
)  # fmt: skip
def test_a_decision_and_its_reason(
    c: Combination, source: FakeEvidence, status: str, says: str
) -> None:
    d = run(c, source)
    assert d.status == status
    assert says in d.reason


def test_a_decided_combination_carries_what_the_closure_needs() -> None:
    d = run(combination(), evidence())
    assert (
        d.torch is not None
        and d.torch.cuda == CudaTag(12, 1)
        and d.torch.cuda_source == "requires-dist"
    )
    assert d.xformers is not None and d.xformers.requires_torch == "==2.4.1"
    assert d.closure_requirements() == ["nvidia-cuda-runtime-cu12==12.1.105", "filelock", "numpy"]
    assert [p.filename for p in d.pins()] == [TORCH.filename, XFORMERS.filename]
    assert d.indexes[0].url == DEFAULT
    result = d.result("resolved", d.resolved_reason())
    assert result.combination == combination()
    assert "xformers 0.0.28.post1 built with torch 2.4.1+cu121, CUDA 12.1" in result.reason


@pytest.mark.parametrize(
    ("torch_cuda", "record", "runtimes", "added"),
    [
        # CUDA 13: the runtime is `nvidia-cuda-runtime` 13.0.x; `-cu13` is only a placeholder
        ("12.1.105", CUDA13_BUILD, CUDA13_RUNTIMES, "nvidia-cuda-runtime==13.0.96"),
        # CUDA 12 under a CUDA 13 torch: `nvidia-cuda-runtime-cu12` 12.8.x
        ("13.0.2", BuildRecord(torch="2.4.1", cuda=CudaTag(12, 8), arch_list=None),
         {"nvidia-cuda-runtime-cu12": runtime_wheels("nvidia-cuda-runtime-cu12", "12.8.57", "12.8.90", "12.9.79")},
         "nvidia-cuda-runtime-cu12==12.8.90"),
    ],
)  # fmt: skip
def test_the_newest_runtime_of_the_build_s_cuda_is_added_when_asked(
    torch_cuda: str,
    record: BuildRecord,
    runtimes: dict[str, list[DistributionFile]],
    added: str,
) -> None:
    d = run(
        combination("default", add_cuda_runtime=True),
        evidence(torch_cuda=torch_cuda, record=record, runtimes=runtimes),
    )
    assert d.status == "decided", d.reason
    assert d.extra_runtime == (added,)
    assert any(f"added {added}" in n for n in d.notes)


@pytest.mark.parametrize("add_cuda_runtime", [False, True])
def test_add_cuda_runtime_is_never_advised_when_no_runtime_could_be_added(
    add_cuda_runtime: bool,
) -> None:
    d = run(combination(add_cuda_runtime=add_cuda_runtime), evidence(record=CUDA13_BUILD))
    assert d.status == "unsatisfiable"
    assert "set add-cuda-runtime = true" not in d.reason
    assert "no CUDA 13.0 runtime wheel" in d.reason
    assert "nvidia-cuda-runtime-cu13, nvidia-cuda-runtime" in d.reason


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (MATCHING, "xformers 0.0.28.post1 was built with CUDA 12.1, the CUDA of torch 2.4.1"),
        (BuildRecord(torch="2.4.1", cuda=CudaTag(12, 4), arch_list=None),
         "xformers 0.0.28.post1 was built with CUDA 12.4, the CUDA major of torch 2.4.1 (12.1)"),
        (None, "xformers 0.0.28.post1 records no build CUDA"),
    ],
)  # fmt: skip
def test_a_cudart_row_that_needs_no_runtime_adds_none_and_says_so(
    record: BuildRecord | None, says: str
) -> None:
    d = run(combination(add_cuda_runtime=True), evidence(record=record))
    assert d.status == "decided"
    assert d.extra_runtime == ()
    assert any(says in n and "add-cuda-runtime = true: no runtime added" in n for n in d.notes), (
        d.notes
    )


@pytest.mark.parametrize(
    ("record", "note"),
    [
        (None, "has no xformers/cpp_lib.json: its build CUDA is unknown"),
        (
            BuildRecord(torch="2.4.1", cuda=CudaTag(12, 4), arch_list=None),
            "CUDA minor versions differ",
        ),
        (
            BuildRecord(torch="2.3.0", cuda=CudaTag(12, 1), arch_list=None),
            "was built against torch 2.3.0",
        ),
    ],
)
def test_what_does_not_stop_a_combination_is_a_note(record: BuildRecord | None, note: str) -> None:
    d = run(combination(), evidence(record=record))
    assert d.status == "decided"
    assert any(note in n for n in d.notes)


def test_a_file_that_does_not_fit_the_target_is_rejected_with_its_reason() -> None:
    source = evidence()
    source.files["torch"].append(wheel("torch", "2.4.1", "cp312-cp312-manylinux_2_28_x86_64"))
    d = run(combination(), source)
    assert d.status == "decided"
    assert [r.filename for r in d.rejected] == ["torch-2.4.1-cp312-cp312-manylinux_2_28_x86_64.whl"]


def test_a_release_missing_from_the_index_names_the_index() -> None:
    source = evidence()
    source.files["torch"] = [wheel("torch", "2.4.0")]
    d = run(combination(), source)
    assert d.status == "unsatisfiable"
    assert d.reason == (
        f"torch 2.4.1 is not on index 'default' ({DEFAULT}); releases there near it: 2.4.0"
    )


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (
            [
                wheel("torch", "2.4.1", "cp311-cp311-manylinux_2_28_aarch64"),
                wheel("torch", "2.4.1", "cp311-cp311-win_amd64"),
                wheel("torch", "2.4.1", "cp312-cp312-manylinux_2_28_aarch64"),
                wheel("torch", "2.4.1", "cp312-cp312-manylinux_2_28_x86_64"),
                wheel("torch", "2.4.1", "cp312-cp312-win_amd64"),
                wheel("torch", "2.4.1", "cp313-cp313-manylinux_2_28_x86_64"),
                wheel("torch", "2.4.1", "cp313-cp313t-manylinux_2_28_x86_64"),
                DistributionFile(
                    filename="torch-2.4.1.tar.gz", url=f"{DEFAULT}/torch-2.4.1.tar.gz"
                ),
            ],
            "the release has wheels for Python 3.11, 3.12 on manylinux_2_28_aarch64, win_amd64; "
            "for Python 3.12, 3.13, 3.13t on manylinux_2_28_x86_64; and a source distribution, "
            "which envbuilder does not install",
        ),
        (
            [
                wheel("torch", "2.4.1", "cp39-abi3-macosx_11_0_arm64"),
                DistributionFile(
                    filename="torch-2.4.1-py3-none-any.whl",
                    url=f"{DEFAULT}/torch-2.4.1-py3-none-any.whl",
                    requires_python=">=3.12",
                ),
            ],
            "the release has wheels for Python 3 on any; for Python 3.9+ (abi3) on "
            "macosx_11_0_arm64; refused: torch-2.4.1-py3-none-any.whl: "
            "Requires-Python >=3.12 excludes Python 3.11",
        ),
        (
            [DistributionFile(filename="torch-2.4.1.tar.gz", url=f"{DEFAULT}/torch-2.4.1.tar.gz")],
            "the release has no wheels, only a source distribution, which envbuilder does not "
            "install",
        ),
    ],
)
def test_no_wheel_fits_says_what_the_release_has_wheels_for(
    files: list[DistributionFile], says: str
) -> None:
    source = evidence()
    source.files["torch"] = files
    d = run(combination(), source)
    assert d.status == "unsatisfiable"
    assert d.reason == (
        f"no torch 2.4.1 wheel fits cp311 on manylinux_2_28_x86_64 on index 'default' ({DEFAULT}): "
        + says
    )


CP312 = wheel("torch", "2.4.1", "cp312-cp312-manylinux_2_28_x86_64")
OLD_BUILD = (
    "xformers 0.0.28.post1 was built against torch 2.3.0; this combination runs it with torch 2.4.1"
)


def without_sha256(file: DistributionFile) -> DistributionFile:
    return DistributionFile(filename=file.filename, url=file.url)


def torch_without_sha256() -> FakeEvidence:
    source = evidence()
    source.files["torch"] = [without_sha256(TORCH)]
    return source


def xformers_without_sha256() -> FakeEvidence:
    source = evidence()
    source.files["xformers"] = [without_sha256(XFORMERS)]
    return source


@pytest.mark.parametrize(
    ("source", "status", "reason", "torch", "xformers", "notes"),
    [
        # xformers' Requires-Dist refuses torch: both choices stay in the answer
        (evidence(xformers_requires="torch==2.3.0"), "unsatisfiable",
         "xformers 0.0.28.post1 requires torch==2.3.0 (its Requires-Dist), which torch 2.4.1 does not satisfy",
         TORCH, XFORMERS, ()),
        # the build record's note is kept beside the reason it ends in
        (evidence(record=BuildRecord(torch="2.3.0", cuda=CudaTag(13, 0), arch_list=None)),
         "unsatisfiable", "no CUDA 13.0 runtime wheel", TORCH, XFORMERS, (OLD_BUILD,)),
        # unreadable evidence: what was refused before it stays
        (torch_without_sha256(), "error",
         "'torch-2.4.1-cp311-cp311-manylinux_2_28_x86_64.whl' has no sha256 on its index",
         None, None, ()),
        (xformers_without_sha256(), "error",
         "'xformers-0.0.28.post1-cp311-cp311-manylinux_2_28_x86_64.whl' has no sha256 on its index",
         TORCH, None, ()),
    ],
)  # fmt: skip
def test_an_answer_short_of_decided_keeps_what_was_found_before_it(
    source: FakeEvidence,
    status: str,
    reason: str,
    torch: DistributionFile | None,
    xformers: DistributionFile | None,
    notes: tuple[str, ...],
) -> None:
    source.files["torch"].append(CP312)
    d = run(combination(), source)
    result = d.result("unsatisfiable" if d.status == "unsatisfiable" else "error", d.reason)
    assert d.status == status
    assert reason in result.reason
    assert [r.filename for r in result.rejected] == [CP312.filename]
    assert (result.torch and result.torch.filename) == (torch and torch.filename)
    assert (result.xformers and result.xformers.filename) == (xformers and xformers.filename)
    assert result.notes == notes
    assert result.extra_runtime == () and result.source_build is None
