"""Host-aware queries: architecture, the driver each CUDA release needs, parsing what
nvidia-smi says, and the ranking with a reason for every rejection."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envbuilder.consumer.host import Gpu, Host, detect_host, parse_nvidia_smi
from envbuilder.consumer.query import Query, answer
from envbuilder.errors import InputError
from envbuilder.lockfile.drivers import (
    MINIMUM_DRIVER,
    cuda_release,
    driver_satisfies,
    minimum_driver,
    required_cuda,
)
from envbuilder.lockfile.model import CompatLock
from envbuilder.target import CudaTag, normalise_arch, platform_arch

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("12.4.127", "12.4"),
        ("13.0", "13.0"),
        ("cu121", "12.1"),
        ("CU130", "13.0"),
        ("cpu", None),
        ("default", None),
        ("", None),
    ],
)
def test_cuda_release(text: str, release: str | None) -> None:
    assert cuda_release(text) == release


@pytest.mark.parametrize(
    ("torch", "xformers", "release"),
    [
        ("12.8", "12.6", "12.8"),
        # a -cudart combination: torch on CUDA 13, xformers built for 12.8: the driver serves both
        ("13.0", "12.8", "13.0"),
        # compared as versions, not strings ("9.2" > "11.8" as text)
        ("9.2", "11.8", "11.8"),
        (None, "12.6", "12.6"),
        (None, None, None),
    ],
)
def test_required_cuda_is_the_newest_build(
    torch: str | None, xformers: str | None, release: str | None
) -> None:
    def tag(cuda: str | None) -> CudaTag | None:
        return None if cuda is None else CudaTag.from_version(cuda)

    assert required_cuda(tag(torch), tag(xformers)) == release


@pytest.mark.parametrize(
    ("release", "driver"),
    [
        ("13.0", "580.65.06"),
        ("12.4", "550.54.14"),
        ("12.8", "570.26"),
        ("12.7", "570.26"),  # not in the table: the next release's driver serves it
        ("99.0", None),  # past the table: unknown
    ],
)
def test_minimum_driver(release: str, driver: str | None) -> None:
    assert minimum_driver(release) == driver


def test_the_driver_table_rises_with_the_release() -> None:
    releases = sorted(MINIMUM_DRIVER, key=lambda r: tuple(int(p) for p in r.split(".")))
    drivers = [tuple(int(p) for p in MINIMUM_DRIVER[r].split(".")) for r in releases]
    assert drivers == sorted(drivers)


@pytest.mark.parametrize(
    ("have", "need", "ok"),
    [
        ("580.65.06", "580.65.06", True),
        ("580.82.07", "580.65.06", True),
        ("575.51.03", "580.65.06", False),
        ("580", "580.65.06", False),
        ("580", "580", True),
        ("1000.1", "580.65.06", True),
        (" 550.54.15 ", "550.54.14", True),
    ],
)
def test_driver_satisfies(have: str, need: str, ok: bool) -> None:
    assert driver_satisfies(have, need) is ok


@pytest.mark.parametrize("bad", ["latest", "580.x", "", "r580"])
def test_a_malformed_driver_is_bad_input(bad: str) -> None:
    with pytest.raises(InputError, match="bad --driver"):
        driver_satisfies(bad, "580")


@pytest.mark.parametrize(
    ("tag", "arch"),
    [
        ("manylinux_2_28_x86_64", "x86_64"),
        ("manylinux_2_28_aarch64", "aarch64"),
        ("manylinux2014_aarch64", "aarch64"),
        ("linux_x86_64", "x86_64"),
        ("win_amd64", "x86_64"),
        ("macosx_11_0_arm64", "aarch64"),
        ("x86_64", "x86_64"),
    ],
)
def test_platform_arch(tag: str, arch: str) -> None:
    assert platform_arch(tag) == arch


@pytest.mark.parametrize(
    ("given", "arch"), [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64")]
)
def test_arch_spellings(given: str, arch: str) -> None:
    assert normalise_arch(given) == arch


def test_an_unknown_arch_is_bad_input() -> None:
    with pytest.raises(InputError, match="bad --arch 'sparc'"):
        normalise_arch("sparc")


@pytest.mark.parametrize(
    ("output", "gpus", "driver"),
    [
        (
            "NVIDIA H200, 9.0, 580.65.06\nNVIDIA H200, 9.0, 580.65.06\n",
            (Gpu(name="NVIDIA H200", compute_capability="9.0"),) * 2,
            "580.65.06",
        ),
        (
            "NVIDIA GH200 480GB, 9.0, 570.124.06\n",
            (Gpu(name="NVIDIA GH200 480GB", compute_capability="9.0"),),
            "570.124.06",
        ),
        # an old nvidia-smi cannot name the compute capability
        (
            "Tesla T4, [N/A], 470.82.01\n",
            (Gpu(name="Tesla T4", compute_capability=None),),
            "470.82.01",
        ),
        ("", (), None),
    ],
)
def test_parse_nvidia_smi(output: str, gpus: tuple[Gpu, ...], driver: str | None) -> None:
    assert parse_nvidia_smi(output) == (gpus, driver)


def test_parse_nvidia_smi_refuses_other_output() -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def _completed(stdout: str, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(args=[], returncode=returncode, stdout=stdout, stderr="")


@pytest.mark.parametrize(
    ("which", "completed", "gpus", "driver", "note"),
    [
        (None, None, (), None, "no NVML and no nvidia-smi on PATH"),
        (
            "/usr/bin/nvidia-smi",
            _completed("NVIDIA H100 80GB HBM3, 9.0, 550.54.15\n"),
            (Gpu(name="NVIDIA H100 80GB HBM3", compute_capability="9.0"),),
            "550.54.15",
            "",
        ),
        (
            "/usr/bin/nvidia-smi",
            _completed("No devices were found\n", returncode=6),
            (),
            None,
            "nvidia-smi exited with status 6: No devices were found",
        ),
    ],
)
def test_detect_host_without_nvml(
    which: str | None,
    completed: subprocess.CompletedProcess[str] | None,
    gpus: tuple[Gpu, ...],
    driver: str | None,
    note: str,
) -> None:
    def run(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert completed is not None
        return completed

    host = detect_host(run=run, which=lambda _: which, nvml=lambda: None)
    assert (host.gpus, host.driver, host.note) == (gpus, driver, note)
    assert host.source == ("nvidia-smi" if gpus else "")


def test_detect_host_prefers_nvml() -> None:
    nvml = ((Gpu(name="NVIDIA GH200 480GB", compute_capability="9.0"),), "580.65.06")

    def run(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise AssertionError("nvidia-smi is not asked when NVML answers")

    host = detect_host(run=run, which=shutil.which, nvml=lambda: nvml)
    assert (host.gpus, host.driver, host.source) == (*nvml, "NVML")


def test_the_lockfile_records_arch_and_driver(compat: CompatLock) -> None:
    by_id = compat.by_id()
    entry = by_id["py3.12-default-torch2.11.0-xformers0.0.35"]
    assert (entry.platform, entry.arch) == ("manylinux_2_28_x86_64", "x86_64")
    assert (entry.cuda_release, entry.minimum_driver) == ("12.4", "550.54.14")
    unsatisfiable = by_id["py3.13-default-torch2.4.1-xformers0.0.28.post1"]
    assert (unsatisfiable.cuda_release, unsatisfiable.minimum_driver) == (None, None)
    assert compat.drivers.minimum["13.0"] == "580.65.06"
    assert "CUDA Toolkit Release Notes" in compat.drivers.source


X86 = "built for x86_64 (manylinux_2_28_x86_64), not aarch64"
OLD_DRIVER = (
    "CUDA 12.4 needs driver >= 550.54.14, not 470.82.01 (not even minor-version "
    "compatibility's 525.60.13)"
)


@pytest.mark.parametrize(
    ("query", "matched", "rejected"),
    [
        # an ARM host (GH200): every lock here is x86_64, and each rejection says so
        (
            Query(arch="aarch64", gpu="GH200", python="3.12"),
            [],
            {"py3.12-default-torch2.11.0-xformers0.0.35": (X86,)},
        ),
        # a GH200 is a Grace (ARM) host even without --arch
        (
            Query(gpu="GH200", python="3.11"),
            [],
            {
                "py3.11-default-torch2.9.0": (
                    "built for x86_64 (manylinux_2_28_x86_64), not aarch64 (a GH200 host)",
                )
            },
        ),
        # a driver too old for CUDA 12.x (below minor-version compatibility's floor) rules
        # out every CUDA build, not the unsatisfiable one
        (
            Query(python="3.13", driver="470.82.01"),
            [("py3.13-default-torch2.4.1-xformers0.0.28.post1", "unsatisfiable")],
            {},
        ),
        (
            Query(python="3.11", driver="470.82.01", arch="x86_64"),
            [],
            {"py3.11-default-torch2.9.0": (OLD_DRIVER,)},
        ),
        # the host as `query --here` sees an H100 box with a new enough driver: best first
        (
            Query(python="3.11", arch="amd64", gpu="9.0", driver="550.54.15"),
            [
                ("py3.11-default-torch2.5.1-xformers0.0.28.post3", "verified"),
                ("py3.11-default-torch2.6.0-xformers0.0.29.post3", "verified-with-workaround"),
                ("py3.11-default-torch2.9.0", "unverified"),
            ],
            {"py3.12-default-torch2.11.0-xformers0.0.35": ("Python 3.12, not 3.11",)},
        ),
        # every reason is given, not the first one found
        (
            Query(python="3.11", arch="aarch64", driver="470"),
            [],
            {
                "py3.12-default-torch2.10.0-xformers0.0.34": (
                    "Python 3.12, not 3.11",
                    X86,
                    "CUDA 12.4 needs driver >= 550.54.14, not 470 (not even minor-version "
                    "compatibility's 525.60.13)",
                )
            },
        ),
    ],
)
def test_answer_ranks_and_gives_every_rejection_a_reason(
    compat: CompatLock,
    query: Query,
    matched: list[tuple[str, str]],
    rejected: dict[str, tuple[str, ...]],
) -> None:
    result = answer(compat, query)
    assert [(m.entry.id, m.verdict.verdict) for m in result.matches] == matched
    reasons = {r.entry.id: r.reasons for r in result.rejected}
    for combo, expected in rejected.items():
        assert reasons[combo] == expected
    assert len(result.matches) + len(result.rejected) == len(compat.combinations)


def test_a_malformed_driver_in_a_query_is_refused(compat: CompatLock) -> None:
    with pytest.raises(InputError, match="bad --driver 'newest'"):
        answer(compat, Query(driver="newest"))


def test_host_describe() -> None:
    host = Host(
        python="3.12",
        arch="aarch64",
        gpus=(Gpu(name="NVIDIA GH200 480GB", compute_capability="9.0"),),
        driver="580.65.06",
        source="nvidia-smi",
    )
    assert host.describe() == (
        "Python 3.12, aarch64, NVIDIA GH200 480GB (sm_90), driver 580.65.06 (from nvidia-smi)"
    )


@pytest.mark.parametrize(
    ("argv", "status", "lines"),
    [
        # a Grace GPU: every x86_64 lock is shown rejected, with why
        (
            ["--gpu", "GH200", "--python", "3.12"],
            1,
            [
                "not for this host (9):",
                # rows with one reason are counted on one line
                "  9 rows, e.g. py3.10-default-torch2.4.1-xformers0.0.28.post1: built for x86_64 (manylinux_2_28_x86_64), not aarch64 (a GH200 host)",
            ],
        ),
        # nothing matched a plain filter: the misses say why
        (["--python", "3.9"], 1, ["not matching (9):"]),
        # a plain filter that matched lists no misses
        (["--python", "3.13"], 0, ["unsatisfiable"]),
    ],
)
def test_query_command_shows_rejections_when_they_explain(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    lines: list[str],
) -> None:
    from envbuilder.cli import main

    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for the whole reason
    lock = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(lock) == 0
    capsys.readouterr()
    assert main(["query", *argv]) == status
    out = capsys.readouterr().out.splitlines()
    for line in lines:
        assert any(o == line or o.startswith(line) for o in out), line
    if status == 0:
        assert not any(o.startswith(("not for this host", "not matching")) for o in out)
