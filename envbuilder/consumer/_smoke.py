"""The doctor's in-environment probe: ``python _smoke.py [--cache DIR] [--recheck]``.

Run by path in a child process so that a crashing CUDA extension cannot take
the doctor down; torch is imported once, here. Prints one JSON object on its
last line of stdout: torch and CUDA facts, whether xformers' C++/CUDA extension
loaded, and — with a CUDA GPU — a tiny attention check (xformers vs SDPA) and a
torch.compile check of each.

The compile checks cost more than the import: they run only when something they
depend on changed since their last run here (`_checkcache`: torch, xformers,
triton and CUDA libraries, the GPU, the driver, the settings, this file), else
their recorded results are reported with the date they were measured (``from``)
and ``cache`` says which. When they run, torch's own caches (FX graph and AOT
autograd) live in the doctor's directory and inductor compiles in this process
(one compile thread: no worker pool importing torch again for two tiny graphs),
while torch's compiler modules are imported in a thread beside the CUDA context's
creation. The eager attention checks always run: they prove the GPU answers.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
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


def _checkcache() -> Any:
    """`_checkcache`, loaded by path from beside this file (envbuilder need not be installed)."""
    import importlib.util

    path = Path(__file__).with_name("_checkcache.py")
    spec = importlib.util.spec_from_file_location("_envbuilder_doctor_checkcache", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_caches(directory: Path) -> None:
    """Point torch's compile caches into the doctor's *directory* (before torch is imported)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(directory / "triton")
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _import_compiler() -> None:
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401


def _xformers(report: dict[str, Any]) -> Any:
    """``xformers.ops`` (None when xformers is absent or breaks), its version, whether its
    extension loaded and the warnings its import gave, into ``report["xformers"]``."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import xformers
            import xformers.ops

        has_cpp = getattr(xformers, "_has_cpp_library", None)
        report["xformers"] = {
            "version": getattr(xformers, "__version__", None),
            "extension_loaded": has_cpp,
            "warnings": [str(w.message)[:500] for w in caught],
        }
        return xformers.ops
    except ImportError as e:
        report["xformers"] = None if "xformers" in str(e.name or "") else {"error": str(e)}
    except Exception as e:  # an xformers that breaks on this torch is a finding, not a crash
        report["xformers"] = {"error": f"import xformers raised {type(e).__name__}: {e}"[:500]}
    return None


def _attention_checks(
    torch: Any,
) -> tuple[Callable[..., Any], Callable[[Any], dict[str, Any]], tuple[Any, ...]]:
    """SDPA in xformers' layout, a check of an output against float32 SDPA, and its inputs."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))

    def sdpa(q: Any, k: Any, v: Any) -> Any:  # [B, M, H, K] in and out, like xformers
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.transpose(1, 2)

    reference = sdpa(q.float(), k.float(), v.float())

    def check(out: Any) -> dict[str, Any]:
        err = float((out.float() - reference).abs().max())
        if not err <= TOLERANCE:
            raise AssertionError(f"max abs error {err:.3g} > {TOLERANCE}")
        return {"max_abs_error": err}

    return sdpa, check, (q, k, v)


class Phases:
    """Seconds by phase since the probe started, into ``report["seconds"]``: where a
    start-up check's time goes (the doctor's ``--json`` shows it, the bench prints it)."""

    def __init__(self, report: dict[str, Any]) -> None:
        self._last = self._start = time.perf_counter()
        self._seconds: dict[str, float] = report.setdefault("seconds", {})

    def done(self, phase: str) -> None:
        now = time.perf_counter()
        self._seconds[phase] = round(now - self._last, 3)
        self._seconds["total"] = round(now - self._start, 3)
        self._last = now


def probe(argv: list[str] | None = None) -> dict[str, Any]:
    """What the environment's torch and xformers are and whether attention gives correct
    numbers, eager and compiled; the compile checks' answers come from the check cache
    while nothing they depend on changed (``--recheck`` runs them anyway)."""
    report: dict[str, Any] = {}
    phases = Phases(report)
    inherited = dict(os.environ)
    args = list(sys.argv[1:] if argv is None else argv)
    override = args[args.index("--cache") + 1] if "--cache" in args else None
    cc = _checkcache()
    cache = cc.cache_dir(sys.prefix, override)
    if cache is not None:
        use_caches(cache)
    try:
        import torch
    except ImportError as e:
        return {"torch": None, "torch_error": str(e)}
    phases.done("import torch")
    report["torch"] = torch.__version__
    report["torch_cuda"] = torch.version.cuda
    cuda = torch.cuda.is_available()
    report["cuda_available"] = cuda
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        report["compute_capability"] = f"{major}.{minor}"
    phases.done("CUDA")
    xops = _xformers(report)
    phases.done("import xformers")
    if not cuda:
        return report
    gpu = cc.gpu_facts()
    if gpu.get("driver"):
        report["driver"] = gpu["driver"]
    key = cc.check_key(__file__, gpu, inherited)
    recorded, report["cache"] = cc.reuse(cc.read_record(cache), key, recheck="--recheck" in args)
    report["cache"]["dir"] = None if cache is None else str(cache)
    compiler = None
    if recorded is None:  # the compile checks run: import their modules beside CUDA's start
        compiler = threading.Thread(target=_import_compiler, name="import-compiler", daemon=True)
        compiler.start()
    phases.done("check record")
    sdpa, check, (q, k, v) = _attention_checks(torch)
    _attempt(report, "attention_sdpa", lambda: check(sdpa(q, k, v)))
    if xops is not None:
        _attempt(
            report, "attention_xformers", lambda: check(xops.memory_efficient_attention(q, k, v))
        )
    phases.done("attention")
    if recorded is not None:
        for name in ("compile_sdpa", "compile_xformers"):
            if name in recorded and (name == "compile_sdpa" or xops is not None):
                report[name] = {**recorded[name], "from": report["cache"]["at"]}
        return report
    if compiler is not None:
        compiler.join()
    phases.done("import compiler")
    # torch.compile's default, as a model's first call compiles: static shapes (measured on
    # an H100: both compiles 3.2 s against 4.7 s with dynamic=True, one run each)
    compiled_sdpa = torch.compile(sdpa)
    _attempt(report, "compile_sdpa", lambda: check(compiled_sdpa(q, k, v)))
    phases.done("compile sdpa")
    if xops is not None:
        compiled_xf: Any = torch.compile(xops.memory_efficient_attention)
        _attempt(report, "compile_xformers", lambda: check(compiled_xf(q, k, v)))
        phases.done("compile xformers")
    note = cc.write_record(cache, key, report)
    if note:
        report["cache"]["note"] = note
    return report


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.stdout.flush()
