"""What the doctor says from its light probe (libraries linked, torch not imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envbuilder.consumer._extload import cuda_runtime_candidates
from envbuilder.consumer.doctor import _probe_findings

LIGHT: dict[str, Any] = {"light": True, "gpu_present": False, "cuda_available": False}


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (
            {**LIGHT, "torch": "2.10.0+cu128", "torch_cuda": "12.8", "xformers": {
                "version": "0.0.35", "extension_loaded": True, "warnings": []}},
            [
                ("torch", "pass", "torch 2.10.0+cu128 (CUDA 12.8; its libraries load, not imported: no GPU here)"),
                ("xformers-extension", "pass", "xformers 0.0.35 C++/CUDA extension links against torch's libraries"),
                ("gpu-smoke", "skip", "not run (no NVIDIA GPU device here)"),
            ],
        ),
        (
            {**LIGHT, "torch": "2.11.0", "torch_cuda": "13.0", "xformers": {
                "version": "0.0.35", "extension_loaded": False,
                "warnings": ["libcudart.so.12: cannot open shared object file"]}},
            [
                ("torch", "pass", "torch 2.11.0 (CUDA 13.0; its libraries load, not imported: no GPU here)"),
                ("xformers-extension", "fail", "libcudart.so.12: cannot open shared object file"),
                ("gpu-smoke", "skip", "not run (no NVIDIA GPU device here)"),
            ],
        ),
        (
            {**LIGHT, "torch": None, "torch_error": "torch's libraries do not load: x.so: undefined symbol: y"},
            [("torch", "fail", "torch's libraries do not load: x.so: undefined symbol: y")],
        ),
    ],
)  # fmt: skip
def test_light_probe_findings(report: dict[str, Any], expected: list[tuple[str, str, str]]) -> None:
    assert [(f.name, f.status, f.detail) for f in _probe_findings(None, report)] == expected


@pytest.mark.parametrize(
    ("files", "torch_cuda", "expected"),
    [
        # a -cudart environment: the cu12 runtime wheel comes before torch's own cu13 one
        (["a/nvidia/cuda_runtime/lib/libcudart.so.12", "a/nvidia/cu13/lib/libcudart.so.13"], "13.0",
         "a/nvidia/cuda_runtime/lib/libcudart.so.12"),
        (["a/nvidia/cu13/lib/libcudart.so.13"], "13.0", "a/nvidia/cu13/lib/libcudart.so.13"),
        (["a/nvidia/cu13/lib/libcudart.so.13"], "12.8", None),
        # the first sys.path entry holding one wins, as for torch
        (["b/nvidia/cuda_runtime/lib/libcudart.so.12", "a/cuda_runtime/lib/libcudart.so.12"], None,
         "a/cuda_runtime/lib/libcudart.so.12"),
        (["a/nvidia/cuda_runtime/lib/libcudart.so"], None, None),
    ],
)  # fmt: skip
def test_the_light_probe_preloads_the_runtime_torch_would(
    tmp_path: Path, files: list[str], torch_cuda: str | None, expected: str | None
) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    found = cuda_runtime_candidates([str(tmp_path / "a"), str(tmp_path / "b")], torch_cuda)
    assert found == ([] if expected is None else [tmp_path / expected])
