"""CUDA architectures: one ``TORCH_CUDA_ARCH_LIST`` entry (`CudaArch`), the lists that
torch (``torch.cuda.get_arch_list()``) and xformers' build record name, and which entry
runs on a GPU of a compute capability (`covering`).

The one reader and the one rule for the whole project: the suite checks with it inside
the images (so it imports the standard library only), and `envbuilder.gpus` hands the
same record to the matrix, the source-build planner and the query's predictions.

What runs where (CUDA's binary compatibility): machine code (SASS) built for X.Y runs on
X.Y and on later minors of the same major (``8.0`` on an 8.6 or 8.9 GPU); arch-specific
code (``9.0a``, ``10.0f``) is counted on its own capability only; PTX (``+PTX``, torch's
``compute_XY``) is compiled by the driver for any later capability, at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["CudaArch", "covering", "parse_arch_list", "torch_arch_list"]

#: a TORCH_CUDA_ARCH_LIST entry: compute capability, an arch-specific "a"/"f", "+PTX"
_CUDA_ARCH = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?", re.IGNORECASE)
#: what separates the entries of a TORCH_CUDA_ARCH_LIST: "8.0 9.0", "8.0;9.0"
_ARCH_LIST_SEPARATOR = re.compile(r"[\s;,]+")
#: torch's names: "sm_90" (machine code), "sm_90a", "compute_90" (PTX)
_TORCH_ARCH = re.compile(r"(sm|compute)_(\d+?)(\d)([af]?)")


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
    sass: bool = True  # machine code; False only for torch's "compute_XY" (PTX alone)

    @classmethod
    def parse(cls, text: str) -> CudaArch | None:
        """The entry *text* spells (``" 9.0+PTX"``), or None for anything else."""
        if m := _CUDA_ARCH.fullmatch(text.strip()):
            return cls(int(m.group(1)), int(m.group(2)), m.group(3).lower(), bool(m.group(4)))
        return None

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.variant}{'+PTX' if self.ptx else ''}"


def parse_arch_list(text: str) -> Iterator[CudaArch]:
    """The entries of a ``TORCH_CUDA_ARCH_LIST`` (``"8.0 9.0+PTX"``, ``"8.0;9.0+ptx"``) that
    parse; others are skipped."""
    for item in _ARCH_LIST_SEPARATOR.split(text.strip()):
        if item and (arch := CudaArch.parse(item)) is not None:
            yield arch


def torch_arch_list(names: Iterable[str]) -> Iterator[CudaArch]:
    """``torch.cuda.get_arch_list()`` (``sm_90``, ``sm_90a``, ``compute_90``) as entries."""
    for name in names:
        if m := _TORCH_ARCH.fullmatch(name):
            major, minor = int(m.group(2)), int(m.group(3))
            if m.group(1) == "compute":
                yield CudaArch(major, minor, ptx=True, sass=False)
            else:
                yield CudaArch(major, minor, m.group(4))


def covering(archs: Iterable[CudaArch], capability: tuple[int, int]) -> str | None:
    """How a GPU of ``capability`` runs code built for ``archs``: the entry whose machine code
    runs there (``"8.0"``, ``"9.0a"``; machine code first, as nothing is compiled at
    start-up), else the entry whose PTX the driver compiles (``"8.0+PTX"``); None when
    nothing runs."""
    archs = list(archs)
    major, minor = capability
    for arch in archs:
        if not arch.sass:
            continue
        if arch.variant and arch.capability == capability:
            return f"{arch.major}.{arch.minor}{arch.variant}"
        if not arch.variant and arch.major == major and arch.minor <= minor:
            return f"{arch.major}.{arch.minor}"
    for arch in archs:
        if arch.ptx and arch.capability <= capability:
            return f"{arch.major}.{arch.minor}+PTX"
    return None
