"""The target that wheels must fit: a CPython version on a platform, built for a CUDA.

The one home of the vocabulary every stage shares: `Target` (its wheel
tags, its marker environment and uv's spelling of its platform), `CudaTag`
(``cu121`` <-> CUDA ``12.1``, the one parser of both spellings), the CUDA
runtime wheels (what they are called, where they put ``libcudart``) and the
patterns a Python version and a platform tag must match. Everything here
is pure: the target is an argument, never the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, TypeAlias

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "PLATFORM_TAG",
    "PYTHON_VERSION",
    "SUPPORTED_PLATFORMS",
    "CudaBuild",
    "CudaTag",
    "Target",
    "cuda_runtime_library_dir",
    "cuda_runtime_projects",
    "cuda_tag_of",
    "library_path",
    "names_cuda_runtime",
    "normalise_cuda",
    "parse_cuda_build",
    "read_cuda_build",
    "unsupported_platform",
]

#: A CPython version as the matrix spells it: ``3.11``.
PYTHON_VERSION = re.compile(r"3\.\d+")
_ARCHES = "x86_64|aarch64|i686|ppc64le|s390x|armv7l"
#: A platform tag the matrix accepts.
PLATFORM_TAG = re.compile(
    rf"(manylinux|musllinux)_\d+_\d+_({_ARCHES})|manylinux(1|2010|2014)_({_ARCHES})"
    rf"|linux_({_ARCHES})|macosx_\d+_\d+_(x86_64|arm64|universal2)|win_amd64|win_arm64|win32"
)

#: The platform tags a target can have: the Linux glibc ones (what torch's CUDA wheels and
#: the CUDA runtime wheels are published for). musllinux, macOS and Windows tags are valid
#: tags, but no CUDA torch is published for the first two and the resolver, the images and
#: the suite are Linux-only, so rows for them are refused when the matrix is loaded.
SUPPORTED_PLATFORMS = ("manylinux_X_Y_ARCH", "manylinux1/2010/2014_ARCH", "linux_ARCH")

_CUDA_TAG = re.compile(r"cu(\d{1,2})(\d)")
_CUDA_VERSION = re.compile(r"(\d{1,2})\.(\d)(?:\.\d+)*")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
_LEGACY = re.compile(r"manylinux(1|2010|2014)_(\w+)")
_LEGACY_TO_GLIBC = {"1": (2, 5), "2010": (2, 12), "2014": (2, 17)}
_GLIBC_TO_LEGACY = {glibc: f"manylinux{name}" for name, glibc in _LEGACY_TO_GLIBC.items()}


@dataclass(frozen=True, order=True)
class CudaTag:
    """A CUDA major.minor, spelled ``cu121`` in tags and ids and ``12.1`` as a version."""

    major: int
    minor: int

    @classmethod
    def from_tag(cls, text: str) -> CudaTag:
        """``cu121`` -> CUDA 12.1; anything else is a ValueError quoting it."""
        if m := _CUDA_TAG.fullmatch(text):
            return cls(int(m.group(1)), int(m.group(2)))
        raise ValueError(f"not a CUDA tag: {text!r} (expected e.g. 'cu121')")

    @classmethod
    def from_version(cls, text: str) -> CudaTag:
        """``12.1`` (or ``12.1.105``, as torch and the runtime wheels spell it) -> CUDA 12.1."""
        if m := _CUDA_VERSION.fullmatch(text):
            return cls(int(m.group(1)), int(m.group(2)))
        raise ValueError(f"not a CUDA version: {text!r} (expected e.g. '12.1')")

    @classmethod
    def parse(cls, text: str) -> CudaTag:
        """Either spelling: ``cu121``, ``12.1`` or ``12.1.105``."""
        if _CUDA_TAG.fullmatch(text):
            return cls.from_tag(text)
        if _CUDA_VERSION.fullmatch(text):
            return cls.from_version(text)
        raise ValueError(f"not a CUDA tag or version: {text!r} (expected e.g. 'cu121' or '12.1')")

    @property
    def tag(self) -> str:
        return f"cu{self.major}{self.minor}"

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return self.tag


#: What a combination asks of torch's build: a CUDA, a CPU build, or whatever build the
#: index has (``default``). Spelled ``cu121``/``cpu``/``default`` by ``str()``.
CudaBuild: TypeAlias = CudaTag | Literal["cpu", "default"]


def parse_cuda_build(text: str) -> CudaBuild | None:
    """A combination's ``cuda``: ``12.1``/``cu121`` -> CUDA 12.1; ``cpu`` and ``default``
    as they are; None for anything else."""
    if text == "cpu":
        return "cpu"
    if text == "default":
        return "default"
    try:
        return CudaTag.parse(text)
    except ValueError:
        return None


def read_cuda_build(value: object, where: str) -> CudaBuild:
    """A record's ``cuda`` read back (`parse_cuda_build` of a string); anything else is a
    ValueError naming *where* the value was found."""
    build = parse_cuda_build(value) if isinstance(value, str) else None
    if build is None:
        raise ValueError(f"{where}: cuda {value!r} is not a CUDA value")
    return build


def normalise_cuda(text: str) -> str | None:
    """`parse_cuda_build` spelled as in ids: ``12.1``/``cu121`` -> ``cu121``, ``cpu``,
    ``default``; None for anything else."""
    build = parse_cuda_build(text)
    return None if build is None else str(build)


def cuda_tag_of(torch_cuda: str | None) -> str:
    """``torch.version.cuda`` as a combination's ``cuda`` field: ``13.0`` -> ``cu130``,
    None (a CPU build) -> ``cpu``."""
    return CudaTag.from_version(torch_cuda).tag if torch_cuda else "cpu"


def cuda_runtime_projects(major: int) -> tuple[str, ...]:
    """Where a CUDA major's runtime (``libcudart.so.<major>``) is published, in the order tried.

    CUDA 12's is ``nvidia-cuda-runtime-cu12``; CUDA 13's is ``nvidia-cuda-runtime``
    (13.0.x, ...), while ``nvidia-cuda-runtime-cu13`` holds only a placeholder release.
    Only a release of the wanted major.minor counts, so a placeholder is never chosen.
    """
    return (f"nvidia-cuda-runtime-cu{major}", "nvidia-cuda-runtime")


_SUFFIXED_RUNTIME = re.compile(r"nvidia-cuda-runtime-cu\d+")


def names_cuda_runtime(project: str) -> bool:
    """Whether a requirement on *project* pins a CUDA runtime release: the runtime wheels
    (`cuda_runtime_projects`) or ``cuda-toolkit``, which newer torch releases pin instead."""
    name = canonicalize_name(project)
    return name in ("nvidia-cuda-runtime", "cuda-toolkit") or bool(
        _SUFFIXED_RUNTIME.fullmatch(name)
    )


def cuda_runtime_library_dir(requirement: str) -> str | None:
    """Where the CUDA runtime wheel *requirement* pins puts its shared libraries, under
    site-packages; None for another project, or ``nvidia-cuda-runtime`` without a pinned
    release (its directory is named after the CUDA major: ``==13.0.96`` -> ``nvidia/cu13/lib``)."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    name = canonicalize_name(req.name)
    if _SUFFIXED_RUNTIME.fullmatch(name):
        return "nvidia/cuda_runtime/lib"
    if name != "nvidia-cuda-runtime":
        return None
    for spec in req.specifier:
        if spec.operator in ("==", "==="):
            try:
                return f"nvidia/cu{Version(spec.version.removesuffix('.*')).major}/lib"
            except InvalidVersion:
                continue
    return None


def library_path(extra_runtime: Iterable[str], *, python: str, venv: str = "/opt/venv") -> str:
    """``LD_LIBRARY_PATH`` for the CUDA runtimes the resolver added (``add-cuda-runtime``).

    torch preloads only the CUDA libraries of its own build; an extension built
    for another CUDA major (xformers for CUDA 12 beside a CUDA 13 torch) finds
    ``libcudart.so.12`` only through the loader's path.
    """
    dirs = [
        f"{venv}/lib/python{python}/site-packages/{found}"
        for requirement in extra_runtime
        if (found := cuda_runtime_library_dir(requirement)) is not None
    ]
    return ":".join(dict.fromkeys(dirs))


def unsupported_platform(platform: str) -> str | None:
    """Why a target cannot have the platform tag *platform*, or None when it can."""
    try:
        _platform_arch(platform)
    except ValueError:
        return (
            f"unsupported target platform {platform!r}: envbuilder resolves for Linux glibc "
            f"targets ({', '.join(SUPPORTED_PLATFORMS)}); musllinux, macOS and Windows "
            "are not supported"
        )
    return None


def _platform_arch(platform: str) -> tuple[tuple[int, int] | None, str]:
    if m := _MANYLINUX.fullmatch(platform):
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    if m := _LEGACY.fullmatch(platform):
        return _LEGACY_TO_GLIBC[m.group(1)], m.group(2)
    if platform.startswith("linux_"):
        return None, platform.removeprefix("linux_")
    raise ValueError(f"unsupported target platform {platform!r}; use e.g. 'manylinux_2_28_x86_64'")


@dataclass(frozen=True, kw_only=True)
class Target:
    """The interpreter and platform that wheels must fit."""

    python: str  # "3.11"
    platform: str = "manylinux_2_28_x86_64"

    @cached_property
    def python_tuple(self) -> tuple[int, int]:
        major, minor = self.python.split(".")
        return int(major), int(minor)

    @cached_property
    def arch(self) -> str:
        return _platform_arch(self.platform)[1]

    @cached_property
    def platforms(self) -> list[str]:
        """Platform tags the target accepts, most specific first.

        A manylinux_2_N target accepts every older manylinux level (and the
        legacy aliases of 2_17, 2_12 and 2_5), then plain ``linux_<arch>``,
        which is how the PyTorch index names many of its wheels.
        """
        glibc, arch = _platform_arch(self.platform)
        tags: list[str] = []
        if glibc is not None:
            major, top = glibc
            for minor in range(top, 4, -1):
                tags.append(f"manylinux_{major}_{minor}_{arch}")
                if (major, minor) in _GLIBC_TO_LEGACY:
                    tags.append(f"{_GLIBC_TO_LEGACY[major, minor]}_{arch}")
        tags.append(f"linux_{arch}")
        return tags

    @cached_property
    def tags(self) -> list[Tag]:
        version = self.python_tuple
        interpreter = f"cp{version[0]}{version[1]}"
        ordered = list(cpython_tags(version, abis=[interpreter], platforms=self.platforms))
        ordered += list(compatible_tags(version, interpreter, self.platforms))
        return ordered

    @cached_property
    def tag_priority(self) -> dict[Tag, int]:
        priority: dict[Tag, int] = {}
        for i, tag in enumerate(self.tags):
            priority.setdefault(tag, i)
        return priority

    @cached_property
    def marker_environment(self) -> dict[str, str]:
        full = f"{self.python}.0"
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.arch,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": full,
            "python_version": self.python,
            "sys_platform": "linux",
            "extra": "",
        }

    @cached_property
    def uv_platform(self) -> str:
        """uv's ``--python-platform`` spelling of the platform tag."""
        glibc, arch = _platform_arch(self.platform)
        if glibc is None:
            return f"{arch}-unknown-linux-gnu"
        return f"{arch}-manylinux_{glibc[0]}_{glibc[1]}"

    def describe(self) -> str:
        return f"cp{self.python.replace('.', '')} on {self.platform}"
