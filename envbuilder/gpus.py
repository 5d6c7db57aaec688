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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from envbuilder.errors import InputError

__all__ = [
    "GPU_ARCH",
    "GPU_COMPUTE_CAPABILITY",
    "CudaArch",
    "arch_covers",
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
#: a TORCH_CUDA_ARCH_LIST entry: compute capability, an arch-specific "a"/"f", "+PTX"
_CUDA_ARCH = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?")
#: what separates the entries of a TORCH_CUDA_ARCH_LIST: "8.0 9.0", "8.0;9.0"
_ARCH_LIST_SEPARATOR = re.compile(r"[\s;,]+")


@dataclass(frozen=True, order=True)
class CudaArch:
    """One ``TORCH_CUDA_ARCH_LIST`` entry: ``9.0``, ``10.0a``, ``8.6+PTX``.

    Ordered by compute capability, then the arch-specific suffix; ``str()``
    spells it as TORCH_CUDA_ARCH_LIST does.
    """

    major: int
    minor: int
    variant: str = ""  # "a", "f" (arch-specific code) or "" (machine code)
    ptx: bool = False  # "+PTX": also PTX the driver compiles for later GPUs

    @classmethod
    def parse(cls, text: str) -> CudaArch | None:
        """The entry *text* spells (``" 9.0+PTX"``), or None for anything else."""
        if m := _CUDA_ARCH.fullmatch(text.strip()):
            return cls(int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4)))
        return None

    @classmethod
    def of(cls, text: str) -> CudaArch | None:
        """An entry, or the compute capability of a GPU the table names (``H200`` -> 9.0)."""
        if (arch := cls.parse(text)) is not None:
            return arch
        cc = gpu_capability(text)
        return None if cc is None else cls.parse(cc)

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.variant}{'+PTX' if self.ptx else ''}"


def parse_arch_list(text: str) -> Iterator[CudaArch]:
    """The entries of a ``TORCH_CUDA_ARCH_LIST`` (``"8.0 9.0+PTX"``, ``"8.0;9.0+ptx"``) that
    parse; others are skipped."""
    for item in _ARCH_LIST_SEPARATOR.split(text.strip()):
        base, plus, suffix = item.partition("+")
        spelt = f"{base}+{suffix.upper()}" if plus else base
        if spelt and (arch := CudaArch.parse(spelt)) is not None:
            yield arch


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


def arch_covers(arch_list: str, cc: str) -> bool:
    """Whether a ``TORCH_CUDA_ARCH_LIST`` (``"8.0 9.0+PTX"``, ``"8.0;9.0"``) runs on *cc*.

    An exact architecture runs natively; ``X+PTX`` is JIT-compiled on anything
    newer than X. Arch-specific entries (``9.0a``) are not counted.
    """
    major, _, minor = cc.partition(".")
    want = (int(major), int(minor or 0))
    return any(
        not arch.variant and (arch.capability == want or (arch.ptx and arch.capability <= want))
        for arch in parse_arch_list(arch_list)
    )
