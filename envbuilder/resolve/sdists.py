"""What a source build of xformers needs, read from its sdist and the CUDA it is built for.

Pure: the sdist's bytes and the CUDA version are arguments. `read_sdist_info`
takes the run-time requirements (``PKG-INFO``) and the build requirements
(``pyproject.toml``'s ``[build-system] requires``) out of a ``.tar.gz`` or
``.zip`` sdist; `compiler_projects` names the wheels that hold a CUDA
release's compiler (nvcc, its front end and NVVM), its headers and CCCL;
`build_flags` is the fixed environment every build of a combination gets.
"""

from __future__ import annotations

import io
import tarfile
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesHeaderParser

from envbuilder.gpus import CudaArch
from envbuilder.target import CudaTag

__all__ = [
    "BUILD_TOOLS",
    "SdistInfo",
    "arch_problem",
    "build_flags",
    "compiler_projects",
    "read_sdist_info",
]

#: Always in a build group: setuptools' wheel command and the ninja that torch's
#: extension builder compiles with (without it, one file at a time).
BUILD_TOOLS: tuple[str, ...] = ("wheel", "ninja")


@dataclass(frozen=True, kw_only=True)
class SdistInfo:
    """The requirements an sdist declares."""

    requires_dist: tuple[str, ...]  # PKG-INFO's Requires-Dist (run time)
    build_requires: tuple[str, ...]  # pyproject.toml's [build-system] requires
    build_backend: str | None


def read_sdist_info(data: bytes, filename: str) -> SdistInfo:
    """Read ``PKG-INFO`` and ``pyproject.toml`` from the sdist's top directory.

    An sdist without ``pyproject.toml`` builds with setuptools (PEP 517's
    fallback): its build requirements are ``setuptools`` alone.
    """
    members = _top_level_members(data, filename, ("PKG-INFO", "pyproject.toml"))
    pkg_info = members.get("PKG-INFO")
    if pkg_info is None:
        raise ValueError(f"{filename!r} has no PKG-INFO: not an sdist")
    headers = BytesHeaderParser().parsebytes(pkg_info)
    requires_dist = tuple(headers.get_all("Requires-Dist") or ())
    build_requires: tuple[str, ...] = ("setuptools",)
    backend: str | None = None
    if (pyproject := members.get("pyproject.toml")) is not None:
        try:
            document = tomllib.loads(pyproject.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"{filename!r}: unreadable pyproject.toml ({e})") from e
        system = document.get("build-system")
        if isinstance(system, dict):
            requires = system.get("requires", [])
            if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
                raise ValueError(f"{filename!r}: [build-system] requires is not a list of strings")
            build_requires = tuple(requires)
            found = system.get("build-backend")
            backend = found if isinstance(found, str) else None
    return SdistInfo(
        requires_dist=requires_dist, build_requires=build_requires, build_backend=backend
    )


def _top_level_members(data: bytes, filename: str, names: Sequence[str]) -> dict[str, bytes]:
    """``<name>-<version>/<member>`` for each of ``names`` that the archive has. A tar is
    read only as far as the last of them: its headers are decompressed and checksummed
    one by one (xformers 0.0.35's has PKG-INFO and pyproject.toml 4th and 6th of 2,429
    members; reading them all took 0.4 s of CPU)."""
    found: dict[str, bytes] = {}
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist():
                    parts = info.filename.split("/")
                    if len(parts) == 2 and parts[1] in names:
                        found[parts[1]] = archive.read(info)
            return found
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for member in archive:
                parts = member.name.split("/")
                if member.isfile() and len(parts) == 2 and parts[1] in names:
                    extracted = archive.extractfile(member)
                    if extracted is not None:
                        found[parts[1]] = extracted.read()
                        if len(found) == len(names):
                            break
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        raise ValueError(f"{filename!r} is not a readable sdist archive ({e})") from e
    return found


def compiler_projects(major: int) -> tuple[str, ...]:
    """The wheels that make a CUDA ``major`` toolchain for torch's extension builder.

    CUDA 13's are unsuffixed (``nvidia-cuda-nvcc 13.0.88``), the compiler's
    front end (``crt``) and NVVM separate; CUDA 12's carry ``-cu12`` and nvcc
    brings its front end and NVVM itself. The runtime wheel brings the headers
    (``cuda_runtime.h``) and ``libcudart``; CCCL the Thrust/CUB/libcu++ headers.
    """
    if major >= 13:
        return (
            "nvidia-cuda-nvcc",
            "nvidia-cuda-crt",
            "nvidia-nvvm",
            "nvidia-cuda-cccl",
            "nvidia-cuda-runtime",
        )
    return (
        f"nvidia-cuda-nvcc-cu{major}",
        f"nvidia-cuda-cccl-cu{major}",
        f"nvidia-cuda-runtime-cu{major}",
    )


#: The oldest and newest compute capability each CUDA major's nvcc compiles for.
_NVCC_ARCHS: Mapping[int, tuple[tuple[int, int], tuple[int, int]]] = {
    11: ((3, 5), (9, 0)),
    12: ((5, 0), (12, 1)),
    13: ((7, 5), (12, 1)),
}


def arch_problem(cuda: CudaTag, arch: str) -> str | None:
    """Why CUDA ``cuda``'s nvcc cannot compile for ``arch`` ("9.0", "10.0a+PTX"), or None."""
    limits = _NVCC_ARCHS.get(cuda.major)
    if limits is None:
        return None
    parsed = CudaArch.parse(arch)
    if parsed is None:
        raise ValueError(f"not a CUDA architecture: {arch!r}")
    cc = parsed.capability
    low, high = limits
    if cc < low or cc > high:
        return (
            f"CUDA {cuda.version}'s nvcc cannot compile for compute capability {arch} "
            f"(it supports {low[0]}.{low[1]} to {high[0]}.{high[1]})"
        )
    return None


def build_flags(*, version: str, arch_list: Sequence[str]) -> tuple[str, ...]:
    """The fixed build environment, ``NAME=value`` sorted: the architectures, a release
    build without line info or debug assertions, the version without a local label, and
    no ``NVCC_FLAGS`` of the host's."""
    flags = {
        "TORCH_CUDA_ARCH_LIST": ";".join(arch_list),
        "XFORMERS_BUILD_TYPE": "Release",
        "XFORMERS_ENABLE_DEBUG_ASSERTIONS": "0",
        "BUILD_VERSION": version,
        "NVCC_FLAGS": "",
        "FORCE_CUDA": "1",
    }
    return tuple(f"{k}={v}" for k, v in sorted(flags.items()))
