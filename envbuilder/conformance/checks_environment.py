"""Environment facts: versions, xformers' build record against what runs, whether its
extension loads (and why not), architecture coverage, and ``python -m xformers.info``.

``import xformers.ops`` must not initialise CUDA, so that check runs first in
this group's fresh process, before anything here touches the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from envbuilder.conformance._archs import covering, parse_arch_list, torch_arch_list
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import USES, CheckSpec, Number, Outcome, Skip

__all__ = ["release_of", "specs"]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> str:
    """``2.10.0+cu128`` -> ``2.10.0``: the public release, without a local label."""
    return version.split("+", 1)[0]


def _xformers_dir() -> Path | None:
    spec = importlib.util.find_spec("xformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _build_record() -> dict[str, Any]:
    where = _xformers_dir()
    if where is None:
        raise Skip("xformers is not installed in this environment")
    path = where / "cpp_lib.json"
    if not path.is_file():
        raise Skip(f"xformers has no build record ({path.name} is absent): a source build?")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def import_no_cuda_init(ctx: Context) -> Outcome:
    import torch

    if torch.cuda.is_initialized():
        raise Skip("CUDA was already initialised in this process before the check ran")
    import xformers.ops  # noqa: F401

    initialised = bool(torch.cuda.is_initialized())
    numbers: dict[str, Number] = {"cuda_initialized_by_import": initialised}
    if initialised:
        return Outcome.failed(
            "`import xformers.ops` initialised CUDA (breaks fork-based DataLoader workers)", numbers
        )
    return Outcome.passed(numbers)


def versions(ctx: Context) -> Outcome:
    import platform

    import torch

    numbers: dict[str, Number] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_git": getattr(torch.version, "git_version", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version()))
        if torch.cuda.is_available()
        else None,
    }
    for dist in ("xformers", "triton", "diffusers", "numpy", "nvidia-cuda-runtime-cu12"):
        numbers[dist.replace("-", "_")] = _version(dist)
    return Outcome.passed(numbers)


def cuda_device(ctx: Context) -> Outcome:
    import torch

    if not ctx.is_cuda:
        raise Skip("no CUDA device visible to torch (torch.cuda.is_available() is False)")
    index = torch.device(ctx.device).index or 0
    props = torch.cuda.get_device_properties(index)
    x = torch.ones(1024, device=ctx.device)
    ok = float((x * 2).sum().item()) == 2048.0
    numbers: dict[str, Number] = {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_mib": int(props.total_memory // (1024 * 1024)),
        "multiprocessors": props.multi_processor_count,
        "device_count": torch.cuda.device_count(),
        "kernel_ran": ok,
    }
    return Outcome.judge([] if ok else ["a trivial kernel gave a wrong result"], numbers)


def torch_arch(ctx: Context) -> Outcome:
    import torch

    if not ctx.is_cuda:
        raise Skip("no CUDA device: architecture coverage needs a GPU")
    cap = torch.cuda.get_device_capability(ctx.device)
    arch_list = torch.cuda.get_arch_list()
    hit = covering(torch_arch_list(arch_list), cap)
    numbers: dict[str, Number] = {
        "compute_capability": f"{cap[0]}.{cap[1]}",
        "torch_arch_list": " ".join(arch_list),
        "covered_by": hit,
    }
    if hit is None:
        return Outcome.failed(
            f"torch has no kernels for compute capability {cap[0]}.{cap[1]}: {arch_list}", numbers
        )
    return Outcome.passed(numbers)


def build_record(ctx: Context) -> Outcome:
    import torch

    record = _build_record()
    version = record.get("version", {})
    env = record.get("env", {})
    built_torch = str(version.get("torch") or "")
    cuda_int = version.get("cuda")
    # xformers records CUDA as major * 100 + minor: 1208 is CUDA 12.8
    built_cuda = f"{cuda_int // 100}.{cuda_int % 100}" if isinstance(cuda_int, int) else None
    numbers: dict[str, Number] = {
        "built_torch": built_torch or None,
        "built_cuda": built_cuda,
        "built_python": version.get("python"),
        "arch_list": env.get("TORCH_CUDA_ARCH_LIST"),
        "running_torch": torch.__version__,
        "running_cuda": torch.version.cuda,
    }
    problems: list[str] = []
    if (
        built_torch
        and release_of(built_torch).split(".")[:2] != release_of(torch.__version__).split(".")[:2]
    ):
        problems.append(f"built for torch {built_torch}, running torch {torch.__version__}")
    if (
        built_cuda
        and torch.version.cuda
        and built_cuda.split(".")[0] != torch.version.cuda.split(".")[0]
    ):
        problems.append(
            f"built with CUDA {built_cuda}, torch uses CUDA {torch.version.cuda}"
            " (a different major: the extension needs that CUDA's runtime library)"
        )
    return Outcome.judge(problems, numbers)


def _cudart_hint() -> str:
    """Where a CUDA 12 runtime wheel put libcudart.so.12, if one is installed but not found."""
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
        if candidate.is_file():
            return (
                f"; note: {candidate} exists (nvidia-cuda-runtime-cu12) but the dynamic loader"
                " does not search there: add its folder to LD_LIBRARY_PATH or preload it"
            )
    return ""


def extension_loads(ctx: Context) -> Outcome:
    import xformers
    from xformers import _cpp_lib

    error = getattr(_cpp_lib, "_cpp_library_load_exception", None)
    numbers: dict[str, Number] = {
        "has_cpp_library": bool(getattr(xformers, "_has_cpp_library", error is None))
    }
    if error is None:
        return Outcome.passed(numbers)
    chain: list[BaseException] = []
    link: BaseException | None = error.__cause__ or error.__context__
    while link is not None and len(chain) < 5:
        chain.append(link)
        link = link.__cause__ or link.__context__
    causes = [" ".join(f"{type(c).__name__}: {c}".split()) for c in chain]
    message = " ".join(str(error).split())
    numbers["message"] = message[:1500]
    numbers["cause"] = " <- ".join(causes)[:1500] if causes else None
    reason = f"xformers' C++/CUDA extension did not load: {causes[-1] if causes else message}"
    if any("libcudart.so.12" in c for c in causes):
        reason += _cudart_hint()
    return Outcome.failed(reason, numbers)


def xformers_arch(ctx: Context) -> Outcome:
    import torch

    if not ctx.is_cuda:
        raise Skip("no CUDA device: architecture coverage needs a GPU")
    arch_text = str(_build_record().get("env", {}).get("TORCH_CUDA_ARCH_LIST") or "")
    if not arch_text:
        raise Skip("xformers' build record has no TORCH_CUDA_ARCH_LIST")
    cap = torch.cuda.get_device_capability(ctx.device)
    hit = covering(parse_arch_list(arch_text), cap)
    numbers: dict[str, Number] = {
        "compute_capability": f"{cap[0]}.{cap[1]}",
        "arch_list": arch_text,
        "covered_by": hit,
    }
    if hit is None:
        return Outcome.failed(
            f"xformers was built for {arch_text!r}, which does not cover compute capability"
            f" {cap[0]}.{cap[1]} ('no kernel image is available for execution on the device')",
            numbers,
        )
    return Outcome.passed(numbers)


def xformers_info(ctx: Context) -> Outcome:
    proc = subprocess.run(
        [sys.executable, "-m", "xformers.info"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = (proc.stdout + proc.stderr).strip()
    numbers: dict[str, Number] = {
        "returncode": proc.returncode,
        "available": len(re.findall(r":\s+available\s*$", output, flags=re.MULTILINE)),
        "unavailable": len(re.findall(r":\s+unavailable\s*$", output, flags=re.MULTILINE)),
        "output": output[-6000:],
    }
    if proc.returncode != 0:
        return Outcome.failed(f"`python -m xformers.info` exited with {proc.returncode}", numbers)
    return Outcome.passed(numbers)


def specs(ctx: Context) -> list[CheckSpec]:
    return [
        CheckSpec(
            name="environment.xformers.import_no_cuda_init",
            gate=False,
            impl="xformers",
            needs=frozenset({"cuda"}),
            run=partial(import_no_cuda_init, ctx),
            quick=False,  # informational, and a fresh interpreter costs ~5 s
        ),
        CheckSpec(name="environment.versions", gate=False, run=partial(versions, ctx)),
        CheckSpec(name="environment.cuda.device", gate=False, run=partial(cuda_device, ctx)),
        CheckSpec(
            name="environment.torch.arch_covered",
            gate=True,
            uses=USES,
            run=partial(torch_arch, ctx),
        ),
        CheckSpec(
            name="environment.xformers.build_record",
            gate=False,
            impl="xformers",
            run=partial(build_record, ctx),
        ),
        CheckSpec(
            name="environment.xformers.extension_loads",
            gate=True,
            uses=USES,
            impl="xformers",
            run=partial(extension_loads, ctx),
        ),
        CheckSpec(
            name="environment.xformers.arch_covered",
            gate=True,
            uses=USES,
            impl="xformers",
            run=partial(xformers_arch, ctx),
        ),
        CheckSpec(
            name="environment.xformers.info",
            gate=False,
            impl="xformers",
            run=partial(xformers_info, ctx),
            quick=False,  # informational, and `python -m xformers.info` costs ~8 s
        ),
    ]
