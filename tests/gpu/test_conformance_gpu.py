"""The suite on a real GPU (run through the device tool; skipped without one).

The recorded proof is in results/*.json (H200, torch 2.11.0+cu130, xformers 0.0.35).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU visible to torch")


def test_quick_attention_and_environment_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder.conformance",
            "--quick",
            "--out",
            str(out),
            "--checks",
            "environment",
            "--checks",
            "attention.sdpa",
            "--checks",
            "performance.sdpa",
        ],
        env=env,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    results: dict[str, Any] = json.loads(out.read_text())
    checks = {c["name"]: c for c in results["checks"]}
    assert results["runner"]["gpus"], "the runner records the GPU"
    assert checks["environment.cuda.device"]["status"] == "pass"
    assert checks["environment.torch.arch_covered"]["status"] == "pass"
    for mask in ("none", "causal", "blockdiag", "bias", "padding"):
        for mode in ("forward", "backward"):
            check = checks[f"attention.sdpa.{mask}.bf16.{mode}"]
            assert check["status"] == "pass", check["reason"]
            assert check["numbers"]["sensitivity_ratio"] >= 4
    speed = checks["performance.sdpa.bf16.s8192.d128"]
    assert speed["status"] == "pass"
    assert speed["numbers"]["fwd_tflops"] > 0
