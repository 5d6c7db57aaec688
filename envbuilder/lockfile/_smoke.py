"""The doctor's in-environment probe, run as ``python -m envbuilder.lockfile._smoke``.

Run in a child process so that a crashing CUDA extension cannot take the
doctor down. Prints one JSON object on its last line of stdout: torch and
CUDA facts, whether xformers' C++/CUDA extension loaded, and — with a CUDA
GPU — a tiny attention check (xformers vs SDPA) and a torch.compile check.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

TOLERANCE = 1e-2  # fp16 attention, max abs difference against SDPA in fp32


def _attempt(report: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
    try:
        report[key] = {"status": "pass", **(fn() or {})}
    except Exception as e:
        report[key] = {
            "status": "fail",
            "error": f"{type(e).__name__}: {e}".strip()[:2000],
            "where": traceback.format_exc(limit=3)[-1500:],
        }


def probe() -> dict[str, Any]:
    report: dict[str, Any] = {}
    try:
        import torch
    except ImportError as e:
        return {"torch": None, "torch_error": str(e)}
    report["torch"] = torch.__version__
    report["torch_cuda"] = torch.version.cuda
    cuda = torch.cuda.is_available()
    report["cuda_available"] = cuda
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        report["compute_capability"] = f"{major}.{minor}"
    xops: Any = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import xformers
            import xformers.ops

        xops = xformers.ops
        has_cpp = getattr(xformers, "_has_cpp_library", None)
        report["xformers"] = {
            "version": getattr(xformers, "__version__", None),
            "extension_loaded": has_cpp,
            "warnings": [str(w.message)[:500] for w in caught],
        }
    except ImportError as e:
        report["xformers"] = None if "xformers" in str(e.name or "") else {"error": str(e)}
    if not cuda:
        return report

    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))

    def sdpa(q: Any, k: Any, v: Any) -> Any:  # [B, M, H, K] in and out, like xformers
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.transpose(1, 2)

    reference = sdpa(q.float(), k.float(), v.float())

    def error(out: Any) -> float:
        return float((out.float() - reference).abs().max())

    def check(out: Any) -> dict[str, Any]:
        err = error(out)
        if not err <= TOLERANCE:
            raise AssertionError(f"max abs error {err:.3g} > {TOLERANCE}")
        return {"max_abs_error": err}

    _attempt(report, "attention_sdpa", lambda: check(sdpa(q, k, v)))
    if xops is not None:
        _attempt(
            report, "attention_xformers", lambda: check(xops.memory_efficient_attention(q, k, v))
        )
    compiled_sdpa = torch.compile(sdpa, dynamic=True)
    _attempt(report, "compile_sdpa", lambda: check(compiled_sdpa(q, k, v)))
    if xops is not None:
        attention: Any = xops.memory_efficient_attention
        compiled_xf: Any = torch.compile(attention, dynamic=True)
        _attempt(report, "compile_xformers", lambda: check(compiled_xf(q, k, v)))
    return report


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.stdout.flush()
