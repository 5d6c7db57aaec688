"""Source builds of xformers, as the matrix asks for them and as the resolver decides them.

The evidence is a fake index laid out like the public one: torch 2.11.0 pins
CUDA 13.0 (``cuda-toolkit``), xformers 0.0.35's wheel is a CUDA 12.8 build, its
sdist declares ``setuptools >= 64`` and ``torch >= 2.10`` to build, and the CUDA
13.0 compiler, front end, NVVM, CCCL and runtime wheels are there (or not).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder.errors import ConfigError
from envbuilder.index.simple import DistributionFile
from envbuilder.model import (
    BuildRecord,
    Combination,
    IndexSpec,
    XformersSource,
    build_lock_filename,
    legacy_build_lock_filename,
    lock_filename,
    suite_lock_filename,
)
from envbuilder.resolve.closure import assembled_lock, lock_inputs
from envbuilder.resolve.decisions import decide
from envbuilder.resolve.locker import LockSettings, lock_build_group
from envbuilder.resolve.matrix import parse_matrix
from envbuilder.resolve.sdists import SdistInfo, compiler_projects
from envbuilder.target import CudaTag
from tests.support.evidence import DEFAULT, FakeEvidence, wheel

TORCH = wheel("torch", "2.11.0", "cp312-cp312-manylinux_2_28_x86_64")
WHEEL = wheel("xformers", "0.0.35", "py39-none-manylinux_2_28_x86_64")
SDIST = DistributionFile(
    filename="xformers-0.0.35.tar.gz",
    url=f"{DEFAULT}/files/xformers-0.0.35.tar.gz",
    hashes={"sha256": "5" * 64},
    size=4258182,
)
CUDA12_8 = BuildRecord(torch="2.10.0+cu128", cuda=CudaTag(12, 8), arch_list="8.0 9.0")
TAG = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"
INFO = SdistInfo(
    requires_dist=("torch>=2.10", "numpy"),
    build_requires=("setuptools >= 64", "torch >= 2.10"),
    build_backend="setuptools.build_meta",
)


def compilers(cuda: str = "13.0", *, without: str = "") -> dict[str, list[DistributionFile]]:
    pages: dict[str, list[DistributionFile]] = {}
    for project in compiler_projects(CudaTag.from_version(cuda).major):
        if project != without:
            name = project.replace("-", "_")
            pages[project] = [wheel(name, f"{cuda}.88", TAG), wheel(name, "13.1.80", TAG)]
    return pages


def index(
    *, sdist: bool = True, info: SdistInfo = INFO, pages: dict[str, list[DistributionFile]] | None
) -> FakeEvidence:
    return FakeEvidence(
        files={
            "torch": [TORCH],
            "xformers": [WHEEL, *([SDIST] if sdist else [])],
            **(compilers() if pages is None else pages),
        },
        requires={
            TORCH.filename: ["cuda-toolkit[cudart]==13.0.2", "filelock"],
            WHEEL.filename: ["torch>=2.10", "numpy"],
        },
        records={WHEEL.filename: CUDA12_8},
        sdists={SDIST.filename: info},
    )


def row(
    source: XformersSource = "when-no-wheel-fits", archs: tuple[str, ...] = ("9.0",)
) -> Combination:
    return Combination(
        id="py3.12-cu130-torch2.11.0-xformers0.0.35",
        python="3.12",
        cuda=CudaTag(13, 0),
        torch="2.11.0",
        xformers="0.0.35",
        xformers_source=source,
        cuda_archs=archs,
    )


def decided(c: Combination, evidence: FakeEvidence) -> tuple[str, str]:
    d = decide(
        c,
        evidence,
        indexes={"default": IndexSpec(name="default", url=None)},
        default_index_url=DEFAULT,
    )
    return d.status, d.reason or (d.resolved_reason() if d.status == "decided" else "")


def test_when_no_wheel_fits_the_sdist_and_its_build_group_are_locked() -> None:
    c = row()
    d = decide(
        c,
        index(pages=None),
        indexes={"default": IndexSpec(name="default", url=None)},
        default_index_url=DEFAULT,
    )
    assert d.status == "decided"
    assert d.resolved_reason().startswith(
        "xformers 0.0.35 built from source for torch 2.11.0+cu130 (no wheel fits: "
        "xformers 0.0.35 was built for torch 2.10.0+cu128 with CUDA 12.8"
    )
    build = d.source_build
    assert build is not None
    assert (build.sdist.filename, build.sdist.sha256, build.sdist.size) == (
        "xformers-0.0.35.tar.gz", "5" * 64, 4258182,
    )  # fmt: skip
    assert build.build_requirements_in == (
        "setuptools>=64",
        "wheel",
        "ninja",
        "nvidia-cuda-nvcc==13.0.88",
        "nvidia-cuda-crt==13.0.88",
        "nvidia-nvvm==13.0.88",
        "nvidia-cuda-cccl==13.0.88",
        "nvidia-cuda-runtime==13.0.88",
    )
    assert "TORCH_CUDA_ARCH_LIST=9.0" in build.flags and build.arch_list == ("9.0",)
    # the main lock holds torch and xformers' run-time requirements, not the sdist
    assert [p.name for p in d.pins()] == ["torch"]
    assert "numpy" in d.closure_requirements()
    assert not any("was built against torch 2.10" in n for n in d.notes)


def test_a_fitting_wheel_is_kept_under_when_no_wheel_fits() -> None:
    evidence = index(pages=None)
    evidence.records[WHEEL.filename] = BuildRecord(
        torch="2.11.0", cuda=CudaTag(13, 0), arch_list="9.0"
    )
    d = decide(
        row(),
        evidence,
        indexes={"default": IndexSpec(name="default", url=None)},
        default_index_url=DEFAULT,
    )
    assert d.status == "decided" and d.source_build is None
    assert [p.name for p in d.pins()] == ["torch", "xformers"]


def test_always_builds_even_when_a_wheel_fits() -> None:
    evidence = index(pages=None)
    evidence.records[WHEEL.filename] = BuildRecord(
        torch="2.11.0", cuda=CudaTag(13, 0), arch_list="9.0"
    )
    status, reason = decided(row("always"), evidence)
    assert status == "decided"
    assert "built from source for torch 2.11.0+cu130 (xformers-source = 'always')" in reason


@pytest.mark.parametrize(
    ("case", "evidence", "archs", "expected"),
    [
        ("no sdist", index(sdist=False, pages=None), ("9.0",),
         "no wheel fits: xformers 0.0.35 was built for torch 2.10.0+cu128 with CUDA 12.8"),
        ("no sdist", index(sdist=False, pages=None), ("9.0",),
         "and xformers 0.0.35 has no sdist on index 'default' to build it from"),
        ("no nvcc for CUDA 13.0", index(pages=compilers(without="nvidia-cuda-nvcc")), ("9.0",),
         "no CUDA 13.0 compiler wheels for cp312 on manylinux_2_28_x86_64 on the default index:"
         " none of nvidia-cuda-nvcc 13.0.*"),
        ("only CUDA 13.1 compilers", index(pages={p: [wheel(p.replace("-", "_"), "13.1.80", TAG)] for p in compiler_projects(13)}), ("9.0",),
         "none of nvidia-cuda-nvcc 13.0.*, nvidia-cuda-crt 13.0.*"),
        ("an arch CUDA 13 dropped", index(pages=None), ("7.0", "9.0"),
         "CUDA 13.0's nvcc cannot compile for compute capability 7.0 (it supports 7.5 to 12.1)"),
        ("the sdist needs another torch to build",
         index(pages=None, info=replace(INFO, build_requires=("setuptools", "torch>=2.12"))), ("9.0",),
         "builds only with torch>=2.12 (its [build-system] requires), not torch 2.11.0"),
    ],
)  # fmt: skip
def test_an_impossible_source_build_is_unsatisfiable_with_its_reason(
    case: str, evidence: FakeEvidence, archs: tuple[str, ...], expected: str
) -> None:
    status, reason = decided(row(archs=archs), evidence)
    assert status == "unsatisfiable", case
    assert expected in reason, case


# --- the matrix ------------------------------------------------------------------------

HEAD = '[[combinations]]\npython = "3.12"\ncuda = "cu130"\ntorch = "2.11.0"\nxformers = "0.0.35"\n'


def load(text: str) -> tuple[Combination, ...]:
    return parse_matrix(text.encode(), path=Path("matrix.toml"), environ={}).combinations


@pytest.mark.parametrize(
    ("keys", "source", "archs"),
    [
        ('xformers-source = true\ncuda-archs = ["9.0"]', "always", ("9.0",)),
        ('xformers-source = "when-no-wheel-fits"\ncuda-archs = ["H200", "8.0", "9.0"]',
         "when-no-wheel-fits", ("8.0", "9.0")),
        ('xformers-source = "always"\ncuda-archs = "10.0a+PTX"', "always", ("10.0a+PTX",)),
        ("xformers-source = false", "never", ()),
        ("", "never", ()),
    ],
)  # fmt: skip
def test_a_row_asks_for_a_source_build_and_its_architectures(
    keys: str, source: str, archs: tuple[str, ...]
) -> None:
    (c,) = load(HEAD + keys + "\n")
    assert (c.xformers_source, c.cuda_archs) == (source, archs)
    assert c.id == "py3.12-cu130-torch2.11.0-xformers0.0.35"  # the id does not change


def test_the_architectures_default_to_the_gpus_the_matrix_targets() -> None:
    text = (
        HEAD
        + 'xformers-source = "when-no-wheel-fits"\n'
        + '[runners]\ndefault = ["self-hosted", "gpu"]\n'
        + '[runners.gpus]\nh100 = ["self-hosted", "h100"]\nl4 = ["self-hosted", "l4"]\n'
    )
    (c,) = load(text)
    assert c.cuda_archs == ("8.9", "9.0")


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ('xformers-source = "sometimes"\ncuda-archs = ["9.0"]',
         "combinations[0].xformers-source: expected true, false or one of 'never', 'always', "
         "'when-no-wheel-fits', got string 'sometimes'"),
        ('xformers-source = "alwys"\ncuda-archs = ["9.0"]', "did you mean 'always'?"),
        ('xformers-source = true\ncuda-archs = ["9"]',
         "combinations[0].cuda-archs[0]: invalid CUDA architecture '9'"),
        ('cuda-archs = ["9.0"]',
         "combinations[0].cuda-archs: is only used by a source build; set xformers-source too"),
        ("xformers-source = true",
         "combinations[0].cuda-archs: a source build needs the CUDA architectures to compile for"),
        ('xformers-source = true\ncuda-archs = ["9.0"]\nadd-cuda-runtime = true',
         "needs no other runtime; choose one of the two"),
    ],
)  # fmt: skip
def test_source_build_keys_are_validated_with_clear_errors(keys: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(HEAD + keys + "\n")
    assert problem in str(e.value)


def test_a_source_build_needs_xformers_and_a_cuda_torch() -> None:
    text = '[[combinations]]\npython = "3.12"\ncuda = "cpu"\ntorch = "2.11.0"\nxformers-source = true\ncuda-archs = ["9.0"]\n'
    with pytest.raises(ConfigError) as e:
        load(text)
    assert "the row has no xformers to build" in str(e.value)
    assert "with cuda = 'cpu'" in str(e.value)


# --- the build group's file name ----------------------------------------------------------------

PYLOCK_NAME = re.compile(
    r"^pylock\.([^.]+)\.toml$"
)  # PEP 751: pylock.<name>.toml, no dot in <name>


@pytest.mark.parametrize("name_of", [lock_filename, suite_lock_filename, build_lock_filename])
def test_every_lock_a_combination_gets_has_a_pep_751_name(name_of: Callable[[str], str]) -> None:
    assert PYLOCK_NAME.match(name_of(row().id)), name_of(row().id)


def test_the_build_group_is_pylock_id_build_toml() -> None:
    assert (
        build_lock_filename(row().id) == "pylock.py3_12-cu130-torch2_11_0-xformers0_0_35-build.toml"
    )


def test_a_build_group_under_its_old_name_is_renamed_offline(tmp_path: Path) -> None:
    """A ``pylock.<name>.build.toml`` of an older release is taken as it is (its inputs hold,
    so no resolver runs: offline) and written under the PEP 751 name; the old file goes."""
    d = decide(
        row(),
        index(pages=None),
        indexes={"default": IndexSpec(name="default", url=None)},
        default_index_url=DEFAULT,
    )
    assert d.source_build is not None and d.status == "decided"
    inputs = {
        **lock_inputs(d.source_build.build_requirements_in, d.target, d.indexes[:1]),
        "group": "build",
    }
    old = tmp_path / "locks" / legacy_build_lock_filename(row().id)
    old.parent.mkdir()
    text, _ = assembled_lock([], pinned=(), inputs=inputs, target=d.target)
    old.write_text(text, encoding="utf-8")
    settings = LockSettings(out_dir=old.parent, cache_dir=tmp_path / "cache", uv="uv", offline=True)
    result = lock_build_group(d, d.result("resolved", d.resolved_reason()), settings)
    assert result.status == "resolved", result.reason
    assert result.source_build is not None
    assert result.source_build.build_lock == f"locks/{build_lock_filename(row().id)}"
    assert (old.parent / build_lock_filename(row().id)).read_text(encoding="utf-8") == text
    assert not old.exists()


@pytest.mark.parametrize(
    ("pages", "status", "xformers"),
    [(None, "decided", SDIST.filename), ({}, "unsatisfiable", None)],
)
def test_a_source_build_keeps_the_files_refused_and_drops_the_wheel_s_findings(
    pages: dict[str, list[DistributionFile]] | None, status: str, xformers: str | None
) -> None:
    """The wheel refused for its CUDA is not used: its notes and dependencies go; the files
    refused on the way stay, in the answer and in an impossible source build's too."""
    evidence = index(pages=pages)
    aarch64 = wheel("xformers", "0.0.35", "py39-none-manylinux_2_28_aarch64")
    evidence.files["xformers"].append(aarch64)
    evidence.requires[WHEEL.filename] = ["torch>=2.10", "numpy", "only-the-wheel-needs-this"]
    d = decide(
        row(),
        evidence,
        indexes={"default": IndexSpec(name="default", url=None)},
        default_index_url=DEFAULT,
    )
    assert d.status == status, d.reason
    assert aarch64.filename in [r.filename for r in d.rejected]
    assert (d.xformers and d.xformers.filename) == xformers
    assert not any("only-the-wheel" in r for r in d.dependencies + d.raw_dependencies)
    assert not any("built against torch 2.10" in n for n in d.notes)
