"""Choosing wheels for a target: tags, ranking, CUDA evidence, xformers' build record."""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from envbuilder.model import BuildRecord
from envbuilder.resolve.wheels import (
    CudaComparison,
    applicable_requirements,
    compare_cuda,
    cuda_from_local_label,
    cuda_from_requirements,
    describe_release,
    parse_build_record,
    portable_requirements,
    rank_wheels,
    requirements_of,
    torch_requirement,
)
from envbuilder.target import CudaTag, Target

PY311 = Target(python="3.11", platform="manylinux_2_28_x86_64")


@dataclass(frozen=True, kw_only=True)
class File:
    """A file as an index lists it (the fields ranking reads)."""

    filename: str
    yanked: bool = False
    yanked_reason: str | None = None
    requires_python: str | None = None


# -- what a release offers, said when nothing fits ----------------------------------------


@pytest.mark.parametrize(
    ("files", "local_label", "says"),
    [
        (["x-1.0-cp311-cp311-win_amd64.whl", "x-1.0-cp310-cp310-win_amd64.whl"], None,
         "the release has wheels for Python 3.10, 3.11 on win_amd64"),
        (["x-1.0-py39-none-manylinux_2_28_aarch64.whl", "x-1.0-cp313-cp313t-manylinux_2_28_aarch64.whl"], None,
         "the release has wheels for Python 3.9+, 3.13t on manylinux_2_28_aarch64"),
        (["x-1.0+cu121-cp312-cp312-linux_x86_64.whl", "x-1.0+cu124-cp311-cp311-linux_x86_64.whl"], "cu121",
         "the release has wheels for Python 3.12 on linux_x86_64"),
        (["x-1.0-pp310-pypy310_pp73-manylinux_2_28_x86_64.whl", "x-1.1-cp311-cp311-win_amd64.whl", "x-1.0.zip"], None,
         "the release has wheels for Python pp310-pypy310_pp73 on manylinux_2_28_x86_64; "
         "and a source distribution, which envbuilder does not install"),
        (["x-1.1-cp311-cp311-win_amd64.whl"], None, "the release has no files"),
    ],
)  # fmt: skip
def test_a_release_is_described_by_its_pythons_and_platforms(
    files: list[str], local_label: str | None, says: str
) -> None:
    found = describe_release(
        [File(filename=f) for f in files], project="x", version="1.0", local_label=local_label
    )
    assert found == says


# -- ranking the files of one release -------------------------------------------------------


def _names(files: tuple[File, ...]) -> list[str]:
    return [f.filename for f in files]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            ["x-1.0-py3-none-any.whl", "x-1.0-cp311-cp311-manylinux_2_17_x86_64.whl"],
            ["x-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", "x-1.0-py3-none-any.whl"],
            id="binary-before-pure",
        ),
        pytest.param(
            [
                "x-1.0-cp311-cp311-manylinux1_x86_64.whl",
                "x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            ],
            [
                "x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                "x-1.0-cp311-cp311-manylinux1_x86_64.whl",
            ],
            id="newer-manylinux-first",
        ),
        pytest.param(
            ["x-1.0-cp39-abi3-manylinux_2_28_x86_64.whl", "x-1.0-cp311-cp311-linux_x86_64.whl"],
            ["x-1.0-cp311-cp311-linux_x86_64.whl", "x-1.0-cp39-abi3-manylinux_2_28_x86_64.whl"],
            id="interpreter-abi-before-abi3",
        ),
        pytest.param(
            [
                "torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl",
                "torch-2.10.0-1-cp311-cp311-manylinux_2_28_x86_64.whl",
            ],
            [
                "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl",
                "torch-2.10.0-1-cp311-cp311-manylinux_2_28_x86_64.whl",
                "torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            ],
            id="higher-build-number-first",
        ),
    ],
)
def test_fitting_wheels_are_ordered_by_tag_then_build_number(
    files: list[str], expected: list[str]
) -> None:
    project, version = files[0].split("-")[:2]
    ranked = rank_wheels(
        [File(filename=f) for f in files], project=project, version=version, target=PY311
    )
    assert _names(ranked.candidates) == expected
    assert ranked.rejected == ()


@pytest.mark.parametrize(
    ("file", "reason"),
    [
        (File(filename="x-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"), "do not fit the target"),
        (File(filename="x-1.0-cp311-cp311-win_amd64.whl"), "do not fit the target cp311"),
        (File(filename="x-1.0-cp311-cp311-manylinux_2_34_x86_64.whl"), "manylinux_2_34"),
        (
            File(filename="x-1.0-py3-none-any.whl", requires_python=">=3.12"),
            "Requires-Python >=3.12 excludes Python 3.11",
        ),
        (
            File(filename="x-1.0-py3-none-any.whl", requires_python="not a specifier"),
            "invalid Requires-Python 'not a specifier'",
        ),
        (File(filename="x-1.0.tar.gz"), "source distribution"),
        (File(filename="x-1.0.zip"), "source distribution"),
    ],
)
def test_a_file_that_cannot_be_used_is_rejected_with_its_reason(file: File, reason: str) -> None:
    ranked = rank_wheels([file], project="x", version="1.0", target=PY311)
    assert ranked.candidates == ()
    assert [(r.filename, r.project) for r in ranked.rejected] == [(file.filename, "x")]
    assert reason in ranked.rejected[0].reason


@pytest.mark.parametrize(
    "filename",
    [
        "x-1.1-py3-none-any.whl",  # another release
        "x-1.1.tar.gz",
        "y-1.0-py3-none-any.whl",  # another project
        "x-1.0-py3-none-any.whl.metadata",
        "not a wheel.whl",
    ],
)
def test_files_of_other_releases_are_neither_candidates_nor_rejections(filename: str) -> None:
    ranked = rank_wheels([File(filename=filename)], project="x", version="1.0", target=PY311)
    assert ranked == type(ranked)(candidates=(), rejected=())


def test_a_yanked_file_is_rejected_when_an_unyanked_one_fits() -> None:
    files = [
        File(
            filename="x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            yanked=True,
            yanked_reason="broken",
        ),
        File(filename="x-1.0-py3-none-any.whl"),
    ]
    ranked = rank_wheels(files, project="x", version="1.0", target=PY311)
    assert _names(ranked.candidates) == ["x-1.0-py3-none-any.whl"]
    assert [r.reason for r in ranked.rejected] == ["yanked (broken)"]
    assert ranked.notes == ()


@pytest.mark.parametrize(("reason", "shown"), [("CUDA bug", "CUDA bug"), (None, "no reason given")])
def test_a_yanked_release_is_used_when_nothing_else_fits_with_a_note(
    reason: str | None, shown: str
) -> None:
    files = [File(filename="x-1.0-py3-none-any.whl", yanked=True, yanked_reason=reason)]
    ranked = rank_wheels(files, project="x", version="1.0", target=PY311)
    assert _names(ranked.candidates) == ["x-1.0-py3-none-any.whl"]
    assert len(ranked.notes) == 1
    assert "yanked" in ranked.notes[0] and shown in ranked.notes[0]
    assert "PEP 592" in ranked.notes[0]


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("cu121", ["torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl", "torch-2.5.1-cp311-cp311-linux_x86_64.whl"]),
        ("cu118", ["torch-2.5.1+cu118-cp311-cp311-linux_x86_64.whl", "torch-2.5.1-cp311-cp311-linux_x86_64.whl"]),
        (None, [
            "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl",
            "torch-2.5.1+cu118-cp311-cp311-linux_x86_64.whl",
            "torch-2.5.1-cp311-cp311-linux_x86_64.whl",
        ]),
    ],
)  # fmt: skip
def test_a_local_label_keeps_that_build_and_unlabelled_files(
    label: str | None, expected: list[str]
) -> None:
    files = [
        File(filename="torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"),
        File(filename="torch-2.5.1+cu118-cp311-cp311-linux_x86_64.whl"),
        File(filename="torch-2.5.1-cp311-cp311-linux_x86_64.whl"),
    ]
    ranked = rank_wheels(files, project="torch", version="2.5.1", target=PY311, local_label=label)
    assert sorted(_names(ranked.candidates)) == sorted(expected)
    other = {f.filename for f in files} - set(expected)
    assert {r.filename for r in ranked.rejected} == other
    for rejection in ranked.rejected:
        assert f"is not the requested +{label}" in rejection.reason


def test_a_pinned_local_version_matches_only_that_build() -> None:
    files = [
        File(filename="torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"),
        File(filename="torch-2.5.1+cu118-cp311-cp311-linux_x86_64.whl"),
    ]
    ranked = rank_wheels(files, project="torch", version="2.5.1+cu118", target=PY311)
    assert _names(ranked.candidates) == ["torch-2.5.1+cu118-cp311-cp311-linux_x86_64.whl"]


# -- CUDA evidence ---------------------------------------------------------------------------


def _version(cuda: CudaTag | None) -> str | None:
    return None if cuda is None else cuda.version


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.5.1+cu121", ("12.1", "local-label", "+cu121")),
        ("2.5.1+cu118", ("11.8", "local-label", "+cu118")),
        ("2.9.0+cu130", ("13.0", "local-label", "+cu130")),
        ("2.5.1+cpu", (None, "local-label", "+cpu")),
        ("2.5.1", None),
        ("2.5.1+rocm6.2", None),
    ],
)
def test_cuda_from_local_label(version: str, expected: tuple[str | None, str, str] | None) -> None:
    got = cuda_from_local_label(Version(version))
    assert (None if got is None else (_version(got[0]), got[1], got[2])) == expected


@pytest.mark.parametrize(
    ("requires_dist", "expected_cuda"),
    [
        (['nvidia-cuda-runtime-cu12 (==12.1.105) ; platform_system == "Linux" and platform_machine == "x86_64"'], "12.1"),
        (['nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"'], "12.4"),
        (['cuda-toolkit[cublas,cudart]==13.0.2; platform_system == "Linux"'], "13.0"),
        (["nvidia-cuda-runtime==13.0.96"], "13.0"),
        (["filelock", "sympy>=1.13.3", "networkx"], None),
        ([], None),
        (['nvidia-cuda-runtime-cu12==12.1.105; platform_machine == "aarch64"'], None),
        (['nvidia-cuda-runtime-cu12==12.1.105; sys_platform == "win32"'], None),
        (['nvidia-cuda-runtime-cu12==12.1.105; extra == "cuda"'], None),
        (["nvidia-cuda-runtime-cu12>=12.1"], None),  # a floor names no build
        (["nvidia-cublas-cu12==12.1.3.1"], None),  # not the runtime
    ],
)  # fmt: skip
def test_cuda_from_the_runtime_torch_pins_for_the_target(
    requires_dist: list[str], expected_cuda: str | None
) -> None:
    cuda, source, evidence = cuda_from_requirements([Requirement(r) for r in requires_dist], PY311)
    assert _version(cuda) == expected_cuda
    if expected_cuda is None:
        assert (source, evidence) == ("none", "no CUDA runtime among its requirements")
    else:
        assert source == "requires-dist"
        assert expected_cuda.split(".")[0] in evidence


def test_the_first_applicable_runtime_pin_wins_over_one_for_another_platform() -> None:
    requirements = [
        Requirement('nvidia-cuda-runtime-cu12==12.6.77; platform_machine == "aarch64"'),
        Requirement('nvidia-cuda-runtime-cu12==12.4.127; platform_machine == "x86_64"'),
    ]
    assert cuda_from_requirements(requirements, PY311)[0] == CudaTag(12, 4)


# -- xformers' build record ------------------------------------------------------------------


def _record(**version: object) -> bytes:
    import json

    return json.dumps({"version": version, "env": {"TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX"}}).encode()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_record(cuda=1201, torch="2.4.1+cu121"), BuildRecord(torch="2.4.1+cu121", cuda=CudaTag(12, 1), arch_list="8.0 9.0+PTX")),
        (_record(cuda=1208, torch="2.10.0+cu128"), BuildRecord(torch="2.10.0+cu128", cuda=CudaTag(12, 8), arch_list="8.0 9.0+PTX")),
        (_record(cuda=1300, torch="2.9.0+cu130"), BuildRecord(torch="2.9.0+cu130", cuda=CudaTag(13, 0), arch_list="8.0 9.0+PTX")),
        (_record(cuda=1108, torch="2.1.0"), BuildRecord(torch="2.1.0", cuda=CudaTag(11, 8), arch_list="8.0 9.0+PTX")),
        (_record(cuda="12.4", torch="2.5.1"), BuildRecord(torch="2.5.1", cuda=CudaTag(12, 4), arch_list="8.0 9.0+PTX")),
        (_record(cuda=None, torch="2.5.1+cpu"), BuildRecord(torch="2.5.1+cpu", cuda=None, arch_list="8.0 9.0+PTX")),
        (_record(cuda=0, torch="2.5.1"), BuildRecord(torch="2.5.1", cuda=None, arch_list="8.0 9.0+PTX")),
        (_record(torch=251), BuildRecord(torch=None, cuda=None, arch_list="8.0 9.0+PTX")),
        (b"{}", BuildRecord(torch=None, cuda=None, arch_list=None)),
        (b"[1, 2]", BuildRecord(torch=None, cuda=None, arch_list=None)),
        (b'{"version": "1201", "env": []}', BuildRecord(torch=None, cuda=None, arch_list=None)),
    ],
)  # fmt: skip
def test_parse_build_record(data: bytes, expected: BuildRecord) -> None:
    assert parse_build_record(data) == expected


@pytest.mark.parametrize("data", [b"", b"not json", b"\xff\xfe{", b'{"version": '])
def test_a_build_record_that_is_not_json_is_an_error(data: bytes) -> None:
    with pytest.raises(ValueError, match=re.escape("cpp_lib.json is not JSON")):
        parse_build_record(data)


@pytest.mark.parametrize(
    ("built_with", "torch_cuda", "expected"),
    [
        ("12.1", "12.1", "same"),
        ("12.1", "12.4", "minor"),
        ("12.8", "12.6", "minor"),
        ("12.8", "13.0", "major"),
        ("13.0", "12.8", "major"),
        ("12.1", None, "cpu-torch"),
        (None, "12.1", "no-record"),
        (None, None, "no-record"),
    ],
)
def test_compare_cuda(
    built_with: str | None, torch_cuda: str | None, expected: CudaComparison
) -> None:
    built = None if built_with is None else CudaTag.from_version(built_with)
    torch = None if torch_cuda is None else CudaTag.from_version(torch_cuda)
    assert compare_cuda(built, torch) == expected


# -- requirements ----------------------------------------------------------------------------


def _metadata(*requires_dist: str) -> Message:
    message = Message()
    message["Name"] = "xformers"
    for line in requires_dist:
        message["Requires-Dist"] = line
    return message


def test_requirements_of_skips_unparsable_lines() -> None:
    reqs = requirements_of(_metadata("numpy", "torch ==2.4.1", "this is not ( a requirement"))
    assert [str(r) for r in reqs] == ["numpy", "torch==2.4.1"]


@pytest.mark.parametrize(
    ("requires_dist", "expected"),
    [
        (["numpy", "torch==2.4.1"], "torch==2.4.1"),
        (["torch>=2.10"], "torch>=2.10"),
        (['torch==2.5.1; platform_system == "Linux"'], 'torch==2.5.1; platform_system == "Linux"'),
        (['torch==2.5.1; platform_system == "Windows"'], None),
        (['torch; extra == "dev"'], None),
        (["numpy"], None),
    ],
)
def test_torch_requirement_is_the_one_that_applies_to_the_target(
    requires_dist: list[str], expected: str | None
) -> None:
    found = torch_requirement(requirements_of(_metadata(*requires_dist)), PY311)
    assert (str(found) if found is not None else None) == expected


@pytest.mark.parametrize(
    ("requires_dist", "exclude", "expected"),
    [
        (["numpy", "torch==2.4.1"], ["torch"], ["numpy"]),
        (["numpy", "torch==2.4.1"], [], ["numpy", "torch==2.4.1"]),
        (['triton==3.0.0; platform_system == "Linux" and platform_machine == "x86_64" and python_version < "3.13"'], [], ["triton==3.0.0"]),
        (['triton==3.0.0; python_version >= "3.13"'], [], []),
        (['pywin32; sys_platform == "win32"'], [], []),
        (['opt-einsum>=3.3; extra == "opt-einsum"'], [], []),
        (["cuda-toolkit[cudart,cublas]==13.0.2"], [], ["cuda-toolkit[cublas,cudart]==13.0.2"]),
        (["Torch==2.4.1", "NumPy"], ["torch"], ["NumPy"]),
        (["pkg @ https://example.invalid/pkg-1.0-py3-none-any.whl"], [], ["pkg @ https://example.invalid/pkg-1.0-py3-none-any.whl"]),
    ],
)  # fmt: skip
def test_applicable_requirements_evaluate_markers_for_the_target(
    requires_dist: list[str], exclude: list[str], expected: list[str]
) -> None:
    requirements = [Requirement(r) for r in requires_dist]
    assert applicable_requirements(requirements, PY311, exclude=exclude) == expected


def test_markers_are_evaluated_for_the_target_python_not_the_host() -> None:
    requirements = [Requirement('numpy<2; python_version < "3.12"')]
    assert applicable_requirements(requirements, Target(python="3.10")) == ["numpy<2"]
    assert applicable_requirements(requirements, Target(python="3.13")) == []


@pytest.mark.parametrize(
    ("requires_dist", "exclude", "expected"),
    [
        (['nvidia-cuda-runtime-cu12==12.1.105; platform_system == "Linux" and platform_machine == "x86_64"'], [], ['nvidia-cuda-runtime-cu12==12.1.105; platform_system == "Linux" and platform_machine == "x86_64"']),
        (['triton==3.0.0; python_version < "3.13"'], [], ['triton==3.0.0; python_version < "3.13"']),
        (['opt-einsum>=3.3; extra == "opt-einsum"'], [], []),
        (['pywin32; sys_platform == "win32"'], [], ['pywin32; sys_platform == "win32"']),
        (["numpy", "torch==2.4.1"], ["torch"], ["numpy"]),
    ],
)  # fmt: skip
def test_portable_requirements_keep_markers_for_a_resolution_across_targets(
    requires_dist: list[str], exclude: list[str], expected: list[str]
) -> None:
    requirements = [Requirement(r) for r in requires_dist]
    assert portable_requirements(requirements, exclude=exclude) == expected
