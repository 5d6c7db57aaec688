"""Windows, macOS and musllinux rows resolved beside Linux ones, with real uv.

The loopback index is laid out like the real ones for these platforms: the
public index's torch has manylinux, win_amd64 and macOS wheels of one
metadata that pins the CUDA runtime for Linux x86_64 only (so its Windows and
macOS wheels are CPU builds); the PyTorch-style index has ``+cu124`` builds
for Linux and Windows; xformers has Linux and Windows wheels and no macOS
one; nothing is published for musllinux. Each resolved lock must be the
closed dependency set of its own platform, markers evaluated for it.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder import cli
from envbuilder.errors import MissingToolError
from envbuilder.pylock import read_lock, select
from envbuilder.resolve.closure import find_uv
from envbuilder.target import Target
from tests.support.closure_check import closure_problems
from tests.support.index_server import IndexServer
from tests.support.wheels import BuiltWheel, build_wheel, cpp_lib_json

LINUX_X86 = 'platform_system == "Linux" and platform_machine == "x86_64"'
TORCH_REQUIRES = [
    "filelock",
    "tqdm",
    "numpy",
    f"nvidia-cuda-runtime-cu12==12.4.127; {LINUX_X86}",
]

LINUX = "py3.11-cu124-manylinux_2_28_x86_64-torch2.5.1-xformers0.0.28.post3"
WINDOWS_GPU = "py3.11-cu124-win_amd64-torch2.5.1-xformers0.0.28.post3"
WINDOWS_CUDA_FROM_DEFAULT = "py3.11-cu124-win_amd64-torch2.5.1"
WINDOWS_CPU = "py3.11-cpu-win_amd64-torch2.5.1"
MACOS = "py3.11-cpu-macosx_14_0_arm64-torch2.5.1"
MACOS_XFORMERS = "py3.11-cpu-macosx_14_0_arm64-torch2.5.1-xformers0.0.28.post3"
MUSL = "py3.11-cpu-musllinux_1_2_x86_64-torch2.5.1"

ROWS = [
    (LINUX, "manylinux_2_28_x86_64", "cu124", "0.0.28.post3", "default"),
    (WINDOWS_GPU, "win_amd64", "cu124", "0.0.28.post3", "pytorch"),
    (WINDOWS_CUDA_FROM_DEFAULT, "win_amd64", "cu124", None, "default"),
    (WINDOWS_CPU, "win_amd64", "cpu", None, "default"),
    (MACOS, "macosx_14_0_arm64", "cpu", None, "default"),
    (MACOS_XFORMERS, "macosx_14_0_arm64", "cpu", "0.0.28.post3", "default"),
    (MUSL, "musllinux_1_2_x86_64", "cpu", None, "default"),
]


@pytest.fixture(scope="module")
def uv() -> str:
    try:
        return find_uv()
    except MissingToolError as e:
        pytest.skip(f"uv is needed for closures: {e}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[BuiltWheel]]:
    d = tmp_path_factory.mktemp("platform-wheels")
    record = cpp_lib_json(torch="2.5.1+cu124", cuda=1204, arch_list="8.0 9.0+PTX")

    def xformers(tag: str) -> BuiltWheel:
        return build_wheel(
            d,
            "xformers",
            "0.0.28.post3",
            tags=tag,
            requires_dist=["torch==2.5.1", "numpy"],
            members={"xformers/cpp_lib.json": record},
        )

    return {
        "torch": [
            build_wheel(d, "torch", "2.5.1", tags=tag, requires_dist=TORCH_REQUIRES)
            for tag in (
                "cp311-cp311-manylinux_2_28_x86_64",
                "cp311-cp311-win_amd64",
                "cp311-none-macosx_11_0_arm64",
            )
        ],
        "torch-cu124": [
            build_wheel(d / "cu124", "torch", "2.5.1+cu124", tags=tag, requires_dist=requires)
            for tag, requires in (
                ("cp311-cp311-linux_x86_64", TORCH_REQUIRES),
                # PyTorch's Windows CUDA builds carry their DLLs: no runtime wheel pinned
                ("cp311-cp311-win_amd64", TORCH_REQUIRES[:3]),
            )
        ],
        "xformers": [
            xformers("cp311-cp311-manylinux_2_28_x86_64"),
            xformers("cp311-cp311-win_amd64"),
        ],
        "nvidia-cuda-runtime-cu12": [
            build_wheel(d, "nvidia-cuda-runtime-cu12", "12.4.127", tags=tag)
            for tag in ("py3-none-manylinux2014_x86_64", "py3-none-win_amd64")
        ],
        "numpy": [
            build_wheel(d, "numpy", "2.1.0", tags=tag)
            for tag in (
                "cp311-cp311-manylinux_2_17_x86_64",
                "cp311-cp311-win_amd64",
                "cp311-cp311-macosx_14_0_arm64",
            )
        ],
        "filelock": [build_wheel(d, "filelock", "3.16.1")],
        "tqdm": [
            build_wheel(
                d, "tqdm", "4.67.1", requires_dist=['colorama; platform_system == "Windows"']
            )
        ],
        "colorama": [build_wheel(d, "colorama", "0.4.6", tags="py2.py3-none-any")],
    }


@pytest.fixture(scope="module")
def server(built: dict[str, list[BuiltWheel]]) -> Iterator[IndexServer]:
    with IndexServer() as s:
        s.add_index("simple", {k: v for k, v in built.items() if k != "torch-cu124"})
        s.add_index("whl/cu124", {"torch": built["torch-cu124"]})
        yield s


def _matrix(tmp_path: Path, server: IndexServer) -> Path:
    rows = ""
    for _, platform, cuda, xformers, torch_index in ROWS:
        rows += (
            f'[[combinations]]\npython = "3.11"\ncuda = "{cuda}"\ntorch = "2.5.1"\n'
            f'platform = "{platform}"\ntorch-index = "{torch_index}"\n'
        )
        if xformers:
            rows += f'xformers = "{xformers}"\n'
    path = tmp_path / "matrix.toml"
    path.write_text(
        f'[indexes.default]\nurl = "{server.index_url("simple")}"\n\n'
        f'[indexes.pytorch]\nurl = "{server.index_url("whl")}/{{cuda}}"\nprojects = ["torch"]\n'
        + rows,
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def resolved(
    server: IndexServer, tmp_path_factory: pytest.TempPathFactory, uv: str
) -> tuple[dict[str, dict[str, Any]], Path]:
    """``envbuilder resolve --json`` of the matrix, in-process: its answers by id, and --out."""
    tmp = tmp_path_factory.mktemp("platforms")
    out = tmp / "locks"
    argv = ["resolve", "--matrix", str(_matrix(tmp, server)), "--out", str(out)]
    argv += ["--cache-dir", str(tmp / "cache"), "--json", "--jobs", "2"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(argv)
    doc = json.loads(printed.getvalue())
    return {c["combination"]["id"]: c for c in doc["combinations"]}, out


EXPECTED = {
    LINUX: ("resolved", "torch 2.5.1 (CUDA 12.4, from requires-dist)"),
    WINDOWS_GPU: ("resolved", "torch 2.5.1+cu124 (CUDA 12.4, from local-label)"),
    WINDOWS_CUDA_FROM_DEFAULT: (
        "unsatisfiable",
        "torch-2.5.1-cp311-cp311-win_amd64.whl is a CPU build (no CUDA runtime among its "
        "requirements), but the combination asks for cu124; torch's Windows wheels on index "
        "'default' are CPU builds where they pin no CUDA runtime",
    ),
    WINDOWS_CPU: ("resolved", "torch 2.5.1 (CPU, from none)"),
    MACOS: ("resolved", "torch 2.5.1 (CPU, from none)"),
    MACOS_XFORMERS: (
        "unsatisfiable",
        "no xformers 0.0.28.post3 wheel fits cp311 on macosx_14_0_arm64",
    ),
    MUSL: ("unsatisfiable", "no torch 2.5.1 wheel fits cp311 on musllinux_1_2_x86_64"),
}


def test_a_matrix_of_four_platforms_gets_one_answer_per_row(
    resolved: tuple[dict[str, dict[str, Any]], Path],
) -> None:
    answers, _ = resolved
    assert list(answers) == [row[0] for row in ROWS]
    got = {cid: (a["status"], a["reason"]) for cid, a in answers.items()}
    for cid, (status, says) in EXPECTED.items():
        assert got[cid][0] == status, (cid, got[cid])
        assert says in got[cid][1], (cid, got[cid])


@pytest.mark.parametrize(
    ("cid", "platform", "expected"),
    [
        (LINUX, "manylinux_2_28_x86_64", {"nvidia-cuda-runtime-cu12", "xformers"}),
        (WINDOWS_GPU, "win_amd64", {"colorama", "xformers"}),
        (WINDOWS_CPU, "win_amd64", {"colorama"}),
        (MACOS, "macosx_14_0_arm64", set()),
    ],
)
def test_each_lock_is_the_closure_of_its_own_platform(
    resolved: tuple[dict[str, dict[str, Any]], Path],
    built: dict[str, list[BuiltWheel]],
    cid: str,
    platform: str,
    expected: set[str],
) -> None:
    answers, out = resolved
    text = (out.parent / answers[cid]["lock"]).read_text(encoding="utf-8")
    target = Target(python="3.11", platform=platform)
    packages = select(read_lock(text, source=cid), target, source=cid)
    metadata = {w.filename: w.metadata for wheels in built.values() for w in wheels}
    roots = ["torch", *(["xformers"] if "xformers" in cid else [])]
    assert closure_problems(packages, target, metadata, roots=roots) == []
    names = {p.name for p in packages}
    common = {"torch", "numpy", "filelock", "tqdm"}
    assert names == common | expected
    assert f"Target: Python 3.11, {platform}." in text


def test_the_closure_check_sees_a_lock_judged_for_another_platform(
    resolved: tuple[dict[str, dict[str, Any]], Path], built: dict[str, list[BuiltWheel]]
) -> None:
    answers, out = resolved
    text = (out.parent / answers[WINDOWS_CPU]["lock"]).read_text(encoding="utf-8")
    windows = Target(python="3.11", platform="win_amd64")
    packages = select(read_lock(text, source=WINDOWS_CPU), windows, source=WINDOWS_CPU)
    metadata = {w.filename: w.metadata for wheels in built.values() for w in wheels}
    linux = Target(python="3.11", platform="manylinux_2_28_x86_64")
    problems = closure_problems(packages, linux, metadata, roots=["torch"])
    assert (
        "colorama is locked, but nothing that applies to manylinux_2_28_x86_64 needs it" in problems
    )
    assert "nvidia-cuda-runtime-cu12 (required by torch) is not locked" in problems
    assert any("torch-2.5.1-cp311-cp311-win_amd64.whl does not fit" in p for p in problems)
