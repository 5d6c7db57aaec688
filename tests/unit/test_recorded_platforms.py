"""Decisions for Linux, Windows, macOS and musllinux targets from index pages recorded from
the public index (tests/data/pages, written by its record.py): torch 2.8.0's wheels for
CPython 3.11 with their Requires-Dist, xformers 0.0.32.post2's with their build records,
and the CUDA 12.8 runtime's. The PyTorch index is not reachable from here: its Windows
build below is laid out as that index names it."""

from __future__ import annotations

import json
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from envbuilder.index.simple import DistributionFile, parse_json_page
from envbuilder.model import BuildRecord, Combination, IndexSpec
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.resolve.evidence import file_version
from envbuilder.resolve.sdists import SdistInfo
from envbuilder.resolve.wheels import parse_build_record
from envbuilder.target import CudaTag, parse_cuda_build

PAGES = Path(__file__).parents[1] / "data" / "pages"
DEFAULT = "http://127.0.0.1:1/simple"
PYTORCH = "http://127.0.0.1:1/whl"
#: the PyTorch index's CUDA 12.8 build for Windows: its CUDA in the local label, its DLLs inside
TORCH_CU128_WINDOWS = "torch-2.8.0+cu128-cp311-cp311-win_amd64.whl"


class RecordedEvidence:
    """`Evidence` from the recorded pages; the per-CUDA index holds one Windows build."""

    def __init__(self) -> None:
        self.metadata_of: dict[str, list[str]] = {}
        self.records: dict[str, Any] = {}
        self.pages: dict[str, list[DistributionFile]] = {}
        for path in sorted(PAGES.glob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            for entry in doc["files"]:
                self.metadata_of[entry["filename"]] = entry["metadata"]["requires-dist"]
                if entry.get("build-record") is not None:
                    self.records[entry["filename"]] = entry["build-record"]
            page = parse_json_page(doc, page_url=f"{DEFAULT}/{path.stem}/", project=path.stem)
            self.pages[path.stem] = list(page.files)
        self.per_cuda = DistributionFile(
            filename=TORCH_CU128_WINDOWS,
            url=f"{PYTORCH}/cu128/torch/{TORCH_CU128_WINDOWS}",
            hashes={"sha256": "c" * 64},
        )
        self.metadata_of[TORCH_CU128_WINDOWS] = ["filelock", "typing-extensions>=4.10.0"]

    def page(self, url: str, project: str, kind: str) -> list[DistributionFile]:
        if url.startswith(PYTORCH):
            return [self.per_cuda] if url.endswith("/cu128") and project == "torch" else []
        return list(self.pages.get(project, []))

    def release_files(
        self, url: str, project: str, kind: str, version: str
    ) -> list[DistributionFile]:
        return [
            f
            for f in self.page(url, project, kind)
            if (v := file_version(f.filename, project)) is not None and v.public == version
        ]

    def metadata(self, file: DistributionFile) -> Message:
        message = Message()
        for line in self.metadata_of[file.filename]:
            message["Requires-Dist"] = line
        return message

    def build_record(self, file: DistributionFile) -> BuildRecord | None:
        record = self.records.get(file.filename)
        return None if record is None else parse_build_record(json.dumps(record).encode())

    def sdist_info(self, file: DistributionFile) -> SdistInfo:
        raise AssertionError("no sdist is recorded")


INDEXES = {
    "default": IndexSpec(name="default", url=None),
    "pytorch": IndexSpec(name="pytorch", url=f"{PYTORCH}/{{cuda}}", projects=("torch",)),
}


def decided(
    platform: str, cuda: str, *, xformers: bool = True, torch_index: str = "default"
) -> Decision:
    c = Combination(
        id=f"{platform}-{cuda}",
        python="3.11",
        platform=platform,
        cuda=parse_cuda_build(cuda) or "default",
        torch="2.8.0",
        xformers="0.0.32.post2" if xformers else None,
        torch_index=torch_index,
    )
    return decide(c, RecordedEvidence(), indexes=INDEXES, default_index_url=DEFAULT)


def test_linux_takes_the_cuda_12_8_build_its_runtime_pin_names() -> None:
    d = decided("manylinux_2_28_x86_64", "cu128")
    assert d.status == "decided", d.reason
    assert d.torch is not None and d.xformers is not None
    assert (d.torch.filename, d.torch.cuda, d.torch.cuda_source) == (
        "torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        CudaTag(12, 8),
        "requires-dist",
    )
    assert d.xformers.filename == "xformers-0.0.32.post2-cp39-abi3-manylinux_2_28_x86_64.whl"
    assert "nvidia-cuda-runtime-cu12==12.8.90" in d.dependencies


def test_windows_takes_torch_s_cuda_build_from_the_per_cuda_index_and_xformers_wheel() -> None:
    d = decided("win_amd64", "cu128", torch_index="pytorch")
    assert d.status == "decided", d.reason
    assert d.torch is not None and d.xformers is not None
    assert (d.torch.filename, d.torch.cuda_source) == (TORCH_CU128_WINDOWS, "local-label")
    assert d.xformers.filename == "xformers-0.0.32.post2-cp39-abi3-win_amd64.whl"
    assert d.xformers.built_with.cuda == CudaTag(12, 8)
    assert d.dependencies == ("filelock", "typing-extensions>=4.10.0", "numpy")


@pytest.mark.parametrize(
    ("platform", "cuda", "xformers", "says"),
    [
        # the public index's Windows torch pins its CUDA runtime for Linux x86_64 only
        ("win_amd64", "default", True, "xformers 0.0.32.post2 is a CUDA 12.8 build (torch 2.8.0+cu128), but torch 2.8.0 is a CPU build: its extension cannot run"),
        ("win_amd64", "cu128", True, "torch-2.8.0-cp311-cp311-win_amd64.whl is a CPU build (no CUDA runtime among its requirements), but the combination asks for cu128; torch's Windows wheels on index 'default' are CPU builds"),
        ("macosx_14_0_arm64", "cpu", True, "no xformers 0.0.32.post2 wheel fits cp311 on macosx_14_0_arm64 on index 'default' (http://127.0.0.1:1/simple): the release has wheels for Python 3.9+ (abi3) on manylinux_2_28_x86_64, win_amd64; xformers' kernels are CUDA kernels and macOS has no CUDA"),
        ("macosx_14_0_arm64", "cu128", False, "torch has no CUDA builds for macOS"),
        ("musllinux_1_2_x86_64", "cpu", False, "no torch 2.8.0 wheel fits cp311 on musllinux_1_2_x86_64 on index 'default' (http://127.0.0.1:1/simple): the release has wheels for Python 3.11 on macosx_11_0_arm64, manylinux_2_28_aarch64, manylinux_2_28_x86_64, win_amd64"),
    ],
)  # fmt: skip
def test_what_cannot_work_says_why(platform: str, cuda: str, xformers: bool, says: str) -> None:
    d = decided(platform, cuda, xformers=xformers)
    assert d.status == "unsatisfiable"
    assert says in d.reason, d.reason


@pytest.mark.parametrize(
    ("platform", "filename"),
    [
        ("win_amd64", "torch-2.8.0-cp311-cp311-win_amd64.whl"),
        ("macosx_14_0_arm64", "torch-2.8.0-cp311-none-macosx_11_0_arm64.whl"),
    ],
)
def test_a_cpu_row_takes_the_platform_s_wheel_without_linux_only_dependencies(
    platform: str, filename: str
) -> None:
    d = decided(platform, "cpu", xformers=False)
    assert d.status == "decided", d.reason
    assert d.torch is not None and d.torch.filename == filename and d.torch.cuda is None
    assert not [r for r in d.dependencies if r.startswith(("nvidia-", "triton"))]
    # the markers are kept for the universal resolution, and evaluated away for the target
    assert any(r.startswith("nvidia-cuda-runtime-cu12") for r in d.raw_dependencies)
