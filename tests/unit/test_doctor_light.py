"""What the doctor says from its light probe (libraries linked, torch not imported)."""

from __future__ import annotations

from typing import Any

import pytest

from envbuilder.lockfile.doctor import _probe_findings

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
