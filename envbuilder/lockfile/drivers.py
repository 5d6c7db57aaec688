"""The NVIDIA driver each CUDA release needs: one table, its source, and comparisons.

A wheel built against CUDA X.Y carries its own runtime (``libcudart``) but uses the
host's driver (``libcuda``), which must be at least the one NVIDIA ships with that
toolkit. The figures are the Linux "Toolkit Driver Version" of each release's GA
in the table below; `envbuilder lock` copies the table and its source into the
lockfile, and each combination records the release and minimum it needs.

The table is the *full-support* driver, recommended. NVIDIA's minor-version
compatibility lets a build for any CUDA 12.x run on a driver from 525.60.13 (13.x:
from 580.65.06, 11.x: from 450.80.02), unless it needs PTX JIT (``+PTX`` kernels
compiled for a GPU newer than the build's architectures) or a feature of the
newer toolkit; `compatible_driver` gives that floor. ``query --driver`` keeps a
combination between the two with a warning naming the rule and its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from envbuilder.errors import InputError
from envbuilder.target import CudaTag

__all__ = [
    "COMPATIBILITY_SOURCE",
    "DRIVER_SOURCE",
    "MINIMUM_DRIVER",
    "MINOR_VERSION_COMPATIBILITY",
    "compatible_driver",
    "cuda_release",
    "driver_satisfies",
    "driver_version",
    "minimum_driver",
    "required_cuda",
]

DRIVER_SOURCE = (
    "NVIDIA CUDA Toolkit Release Notes, table 'CUDA Toolkit and Corresponding Driver "
    "Versions': Toolkit Driver Version, Linux x86_64, of each release's GA"
)

#: CUDA release (major.minor) -> minimum Linux driver, from `DRIVER_SOURCE`.
MINIMUM_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

COMPATIBILITY_SOURCE = (
    "NVIDIA CUDA Compatibility guide, 'Minor Version Compatibility': a CUDA X.y build runs "
    "on the first driver of CUDA X.0's branch, unless it needs PTX JIT"
)

#: CUDA major -> the driver from which its minor-version compatibility holds
#: (`COMPATIBILITY_SOURCE`; the table's X.0 rows, 11.x from 450.80.02).
MINOR_VERSION_COMPATIBILITY: dict[int, str] = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}


def compatible_driver(release: str | None) -> str | None:
    """The oldest driver *release* (``12.4``) runs on by minor-version compatibility; None
    for a major the table lacks."""
    if release is None:
        return None
    try:
        major = CudaTag.from_version(release).major
    except ValueError:
        return None
    return MINOR_VERSION_COMPATIBILITY.get(major)


_DRIVER = re.compile(r"\d+(\.\d+){0,2}")


def cuda_release(text: str) -> str | None:
    """``12.4.127`` / ``12.4`` / ``cu124`` -> ``12.4``; ``cpu``, ``default``, "" -> None."""
    try:
        return CudaTag.parse(text.strip().lower()).version
    except ValueError:
        return None


def _release_key(release: str) -> tuple[int, int]:
    tag = CudaTag.from_version(release)
    return tag.major, tag.minor


def required_cuda(torch_cuda: CudaTag | None, xformers_cuda: CudaTag | None) -> str | None:
    """The newest CUDA release the combination's binaries were built with (torch's CUDA, and
    the CUDA xformers' ``cpp_lib.json`` names): the driver must serve both."""
    found = [c for c in (torch_cuda, xformers_cuda) if c is not None]
    return max(found).version if found else None


def minimum_driver(release: str, table: Mapping[str, str] = MINIMUM_DRIVER) -> str | None:
    """The driver *release* needs; a release the table lacks takes the next one it has
    (a newer toolkit's driver serves every older one), None past the table's end."""
    if release in table:
        return table[release]
    later = sorted((r for r in table if _release_key(r) > _release_key(release)), key=_release_key)
    return table[later[0]] if later else None


def driver_version(text: str, what: str = "--driver") -> tuple[int, ...]:
    """``580.65.06`` -> (580, 65, 6); anything else is bad input naming *what*."""
    text = text.strip()
    if not _DRIVER.fullmatch(text):
        raise InputError(
            f"bad {what} {text!r}: give the NVIDIA driver version, e.g. 580.65.06 or 550 "
            "(nvidia-smi --query-gpu=driver_version --format=csv,noheader)"
        )
    return tuple(int(p) for p in text.split("."))


def driver_satisfies(have: str, need: str) -> bool:
    """Whether driver *have* is at least *need*; a bare branch (``580``) counts as its first
    release, so it satisfies ``580`` but not ``580.65.06``."""
    return _padded(driver_version(have)) >= _padded(driver_version(need, "minimum driver"))


def _padded(version: Iterable[int]) -> tuple[int, ...]:
    parts = list(version)
    return tuple(parts + [0] * (3 - len(parts)))
