"""GPUs and the architectures kernels are built for: ``--gpu sm90``, ``9.0``, ``H100``,
and ``TORCH_CUDA_ARCH_LIST`` entries (`CudaArch`).

Names map to a CUDA compute capability through the table below; a name the
table lacks is looked up among the GPUs the lockfile's runners recorded (their
``compute_capability``). Runs match a GPU by compute capability: kernels are
built per architecture, so an H100 run speaks for an H200 and vice versa.

The matrix (``cuda-archs``), the source-build planner and the query's
predictions read architectures through `CudaArch` alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from envbuilder.conformance._archs import CudaArch, covering, parse_arch_list
from envbuilder.errors import InputError

__all__ = [
    "GPU_ARCH",
    "GPU_COMPUTE_CAPABILITY",
    "CudaArch",
    "arch_covering",
    "arch_covers",
    "arch_of",
    "compute_capability",
    "gpu_arch",
    "gpu_capability",
    "gpu_model",
    "parse_arch_list",
    "same_model",
    "sm",
]

#: Data-centre and common desktop GPUs -> compute capability.
GPU_COMPUTE_CAPABILITY: dict[str, str] = {
    "V100": "7.0",
    "T4": "7.5",
    "A100": "8.0",
    "A800": "8.0",
    "A10": "8.6",
    "A10G": "8.6",
    "A40": "8.6",
    "RTX3090": "8.6",
    "L4": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "RTX4090": "8.9",
    "H100": "9.0",
    "H800": "9.0",
    "H200": "9.0",
    "GH200": "9.0",
    "B100": "10.0",
    "B200": "10.0",
    "GB200": "10.0",
    "RTX5090": "12.0",
}

#: GPUs that come only on one CPU architecture: the Grace superchips are ARM (aarch64).
GPU_ARCH: dict[str, str] = {"GH200": "aarch64", "GB200": "aarch64"}

_SM = re.compile(r"sm_?(\d+)(\d)", re.IGNORECASE)
_DOTTED = re.compile(r"\d+\.\d")


def _squash(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).upper()


def compute_capability(gpu: str, recorded: Iterable[tuple[str, str | None]] = ()) -> str:
    """The compute capability *gpu* stands for; *recorded* are (name, cc) pairs seen by runners."""
    text = gpu.strip()
    if m := _SM.fullmatch(text):
        return f"{int(m.group(1))}.{m.group(2)}"
    if _DOTTED.fullmatch(text):
        return text
    key = _squash(text)
    if key in GPU_COMPUTE_CAPABILITY:
        return GPU_COMPUTE_CAPABILITY[key]
    for name, cc in recorded:
        if cc and key in _squash(name):
            return cc
    known = ", ".join(sorted(GPU_COMPUTE_CAPABILITY))
    raise InputError(
        f"unknown GPU {gpu!r}: give a compute capability (sm90 or 9.0) or one of {known}"
    )


def gpu_model(name: str) -> str | None:
    """The model of the table a GPU's name names: ``NVIDIA H100 80GB HBM3`` -> ``H100``,
    ``NVIDIA GH200 480GB`` -> ``GH200`` (the longest model in the name); None for others."""
    key = _squash(name)
    found = [model for model in GPU_COMPUTE_CAPABILITY if model in key]
    return max(found, key=len) if found else None


def same_model(a: str, b: str) -> bool:
    """Whether two GPU names name one model (``H100`` and ``NVIDIA H100 80GB HBM3``)."""
    model = gpu_model(a)
    return model == gpu_model(b) if model is not None else _squash(a) == _squash(b)


def sm(cc: str) -> str:
    """``9.0`` -> ``sm_90``."""
    return "sm_" + cc.replace(".", "")


def gpu_arch(gpu: str) -> str | None:
    """The CPU architecture a GPU name implies (``GH200`` -> ``aarch64``); None for most."""
    return GPU_ARCH.get(_squash(gpu))


def gpu_capability(name: str) -> str | None:
    """The compute capability of a GPU the table names (``h200``, ``RTX 4090``), or None."""
    return GPU_COMPUTE_CAPABILITY.get(_squash(name))


def arch_of(text: str) -> CudaArch | None:
    """An entry (``9.0a``), or the compute capability of a GPU the table names (``H200`` -> 9.0)."""
    if (arch := CudaArch.parse(text)) is not None:
        return arch
    cc = gpu_capability(text)
    return None if cc is None else CudaArch.parse(cc)


def arch_covering(arch_list: str, cc: str) -> str | None:
    """The entry of a ``TORCH_CUDA_ARCH_LIST`` (``"8.0 9.0+PTX"``, ``"8.0;9.0"``) whose code
    runs on a GPU of *cc*: machine code (``"8.0"`` runs on 8.6), else PTX the driver
    compiles (``"8.0+PTX"``); None when nothing runs (the rule: `covering`)."""
    major, _, minor = cc.partition(".")
    return covering(parse_arch_list(arch_list), (int(major), int(minor or 0)))


def arch_covers(arch_list: str, cc: str) -> bool:
    """Whether anything of a ``TORCH_CUDA_ARCH_LIST`` runs on a GPU of *cc*."""
    return arch_covering(arch_list, cc) is not None
