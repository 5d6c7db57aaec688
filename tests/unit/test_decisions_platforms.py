"""Decisions for Windows, macOS and musllinux targets, from index pages as those indexes
lay them out (the files' real names; Requires-Dist with the real markers)."""

from __future__ import annotations

import pytest

from envbuilder.index.simple import DistributionFile
from envbuilder.model import BuildRecord, Combination, IndexSpec
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.target import CudaTag, parse_cuda_build
from tests.support.evidence import DEFAULT, FakeEvidence, wheel

LINUX_X86 = 'platform_system == "Linux" and platform_machine == "x86_64"'
#: torch 2.5.1's Requires-Dist, the same in each of its wheels on the public index
TORCH_REQUIRES = [
    "filelock",
    "typing-extensions>=4.8.0",
    f"nvidia-cuda-runtime-cu12==12.4.127; {LINUX_X86}",
    f'triton==3.1.0; {LINUX_X86} and python_version < "3.13"',
    'setuptools; python_version >= "3.12"',
]
TORCH = [
    wheel("torch", "2.5.1", "cp311-cp311-manylinux1_x86_64"),
    wheel("torch", "2.5.1", "cp311-cp311-win_amd64"),
    wheel("torch", "2.5.1", "cp311-none-macosx_11_0_arm64"),
]
#: the PyTorch index's Windows CUDA build: CUDA in its local label, its DLLs inside
TORCH_CU124_WINDOWS = wheel("torch", "2.5.1+cu124", "cp311-cp311-win_amd64")
TORCH_CU130_WINDOWS = wheel("torch", "2.9.0+cu130", "cp311-cp311-win_amd64")
XFORMERS = [
    wheel("xformers", "0.0.28.post3", "cp311-cp311-manylinux_2_28_x86_64"),
    wheel("xformers", "0.0.28.post3", "cp311-cp311-win_amd64"),
]
XFORMERS_12_8 = wheel("xformers", "0.0.32.post2", "cp39-abi3-win_amd64")
RUNTIMES = [
    wheel("nvidia_cuda_runtime_cu12", "12.8.90", "py3-none-manylinux_2_27_x86_64"),
    wheel("nvidia_cuda_runtime_cu12", "12.8.90", "py3-none-win_amd64"),
    wheel("nvidia_cuda_runtime_cu12", "12.8.91", "py3-none-manylinux_2_27_x86_64"),  # Linux only
]
BUILT_12_4 = BuildRecord(torch="2.5.1+cu124", cuda=CudaTag(12, 4), arch_list="8.0 9.0+PTX")
BUILT_12_8 = BuildRecord(torch="2.8.0+cu128", cuda=CudaTag(12, 8), arch_list="8.0 9.0+PTX")


class TwoIndexes(FakeEvidence):
    """The per-CUDA index lists the builds with a local label, the default index the rest."""

    def page(self, url: str, project: str, kind: str) -> list[DistributionFile]:
        per_cuda = url != DEFAULT
        return [f for f in super().page(url, project, kind) if ("+" in f.filename) is per_cuda]


SOURCE = TwoIndexes(
    files={
        "torch": [*TORCH, TORCH_CU124_WINDOWS, TORCH_CU130_WINDOWS],
        "xformers": [*XFORMERS, XFORMERS_12_8],
        "nvidia-cuda-runtime-cu12": RUNTIMES,
    },
    requires={
        **{w.filename: TORCH_REQUIRES for w in TORCH},
        TORCH_CU124_WINDOWS.filename: TORCH_REQUIRES[:2],
        TORCH_CU130_WINDOWS.filename: TORCH_REQUIRES[:2],
        **{w.filename: ["torch==2.5.1", "numpy"] for w in XFORMERS},
        XFORMERS_12_8.filename: ["torch>=2.8", "numpy"],
    },
    records={
        **{w.filename: BUILT_12_4 for w in XFORMERS},
        XFORMERS_12_8.filename: BUILT_12_8,
    },
)
INDEXES = {
    "default": IndexSpec(name="default", url=None),
    "pytorch": IndexSpec(name="pytorch", url=f"{DEFAULT}/{{cuda}}", projects=("torch",)),
}


def row(
    platform: str,
    cuda: str,
    *,
    torch: str = "2.5.1",
    xformers: str | None = None,
    torch_index: str = "default",
    **more: object,
) -> Combination:
    return Combination(
        id=f"{platform}-{cuda}",
        python="3.11",
        platform=platform,
        cuda=parse_cuda_build(cuda) or "default",
        torch=torch,
        xformers=xformers,
        torch_index=torch_index,
        **more,  # type: ignore[arg-type]
    )


def run(c: Combination) -> Decision:
    return decide(c, SOURCE, indexes=INDEXES, default_index_url=DEFAULT)


@pytest.mark.parametrize(
    ("c", "status", "says"),
    [
        pytest.param(row("win_amd64", "cpu"), "decided", "", id="windows-cpu"),
        pytest.param(row("win_amd64", "cu124", xformers="0.0.28.post3", torch_index="pytorch"), "decided", "", id="windows-cuda-from-a-per-cuda-index"),
        pytest.param(row("win_amd64", "cu124"), "unsatisfiable", "torch-2.5.1-cp311-cp311-win_amd64.whl is a CPU build (no CUDA runtime among its requirements), but the combination asks for cu124; torch's Windows wheels on index 'default' are CPU builds where they pin no CUDA runtime: take a CUDA build for Windows from a per-CUDA index (torch-index)", id="windows-cuda-from-the-default-index"),
        pytest.param(row("win_amd64", "cpu", xformers="0.0.28.post3"), "unsatisfiable", "xformers 0.0.28.post3 is a CUDA 12.4 build (torch 2.5.1+cu124), but torch 2.5.1 is a CPU build", id="windows-cpu-torch-with-xformers"),
        pytest.param(row("macosx_14_0_arm64", "cpu"), "decided", "", id="macos-cpu"),
        pytest.param(row("macosx_14_0_arm64", "default"), "decided", "", id="macos-default"),
        pytest.param(row("macosx_14_0_arm64", "cu121"), "unsatisfiable", "torch has no CUDA builds for macOS: a macOS row is cuda = 'cpu' (MPS is in it)", id="macos-cuda"),
        pytest.param(row("macosx_14_0_arm64", "cpu", xformers="0.0.28.post3", xformers_source="when-no-wheel-fits"), "unsatisfiable", "no xformers 0.0.28.post3 wheel fits cp311 on macosx_14_0_arm64 on index 'default' (http://127.0.0.1:1/simple): the release has wheels for Python 3.11 on manylinux_2_28_x86_64, win_amd64; xformers' kernels are CUDA kernels and macOS has no CUDA", id="macos-xformers"),
        pytest.param(row("macosx_11_0_x86_64", "cpu"), "unsatisfiable", "no torch 2.5.1 wheel fits cp311 on macosx_11_0_x86_64", id="macos-intel"),
        pytest.param(row("musllinux_1_2_x86_64", "cpu"), "unsatisfiable", "no torch 2.5.1 wheel fits cp311 on musllinux_1_2_x86_64 on index 'default' (http://127.0.0.1:1/simple): the release has wheels for Python 3.11 on macosx_11_0_arm64, manylinux1_x86_64, win_amd64", id="musllinux"),
    ],
)  # fmt: skip
def test_each_platform_gets_an_answer_with_its_reason(
    c: Combination, status: str, says: str
) -> None:
    d = run(c)
    assert (d.status, says in d.reason) == (status, True), d.reason


@pytest.mark.parametrize(
    ("platform", "cuda", "torch_index", "dependencies"),
    [
        ("win_amd64", "cpu", "default", ("filelock", "typing-extensions>=4.8.0")),
        ("win_amd64", "cu124", "pytorch", ("filelock", "typing-extensions>=4.8.0")),
        ("macosx_14_0_arm64", "cpu", "default", ("filelock", "typing-extensions>=4.8.0")),
        ("manylinux_2_28_x86_64", "cu124", "default", ("filelock", "typing-extensions>=4.8.0", "nvidia-cuda-runtime-cu12==12.4.127", "triton==3.1.0")),
    ],
)  # fmt: skip
def test_torch_s_markers_are_evaluated_for_the_target(
    platform: str, cuda: str, torch_index: str, dependencies: tuple[str, ...]
) -> None:
    d = run(row(platform, cuda, torch_index=torch_index))
    assert d.status == "decided", d.reason
    assert d.torch is not None
    assert d.torch.cuda == (CudaTag(12, 4) if cuda == "cu124" else None)
    assert d.torch.filename.endswith(("win_amd64.whl", "macosx_11_0_arm64.whl", "x86_64.whl"))
    assert d.dependencies == dependencies


def test_a_windows_row_adds_the_windows_runtime_xformers_was_built_for() -> None:
    c = row(
        "win_amd64",
        "cu130",
        torch="2.9.0",
        xformers="0.0.32.post2",
        torch_index="pytorch",
        add_cuda_runtime=True,
    )
    d = run(c)
    assert d.status == "decided", d.reason
    assert d.extra_runtime == ("nvidia-cuda-runtime-cu12==12.8.90",)  # 12.8.91: Linux only
    assert any("nvidia/cuda_runtime/bin" in note for note in d.notes)


def test_a_windows_source_build_is_unsatisfiable_naming_the_linux_image() -> None:
    c = row(
        "win_amd64", "cu124", xformers="0.0.28.post3", torch_index="pytorch",
        xformers_source="always", cuda_archs=("8.0",),
    )  # fmt: skip
    d = run(c)
    assert d.status == "unsatisfiable"
    assert d.reason == (
        "xformers-source = 'always'; a source build compiles in a glibc Linux image, "
        "and this row is for win_amd64"
    )
