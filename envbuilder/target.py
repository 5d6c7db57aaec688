"""The target that wheels must fit: a CPython version on a platform, built for a CUDA.

The one home of the vocabulary every stage shares: `Target` (its wheel
tags, its marker environment and uv's spelling of its platform, for glibc
Linux, musllinux, macOS and Windows tags alike), `CudaTag`
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
from pathlib import PureWindowsPath
from typing import Literal, TypeAlias

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags, mac_platforms
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuilder.errors import InputError

__all__ = [
    "ARCHES",
    "ARCH_ALIASES",
    "PLATFORM_TAG",
    "PYTHON_VERSION",
    "SUPPORTED_PLATFORMS",
    "CudaBuild",
    "CudaTag",
    "PlatformFamily",
    "Target",
    "cuda_runtime_library_dir",
    "cuda_runtime_projects",
    "cuda_tag_of",
    "library_path",
    "names_cuda_runtime",
    "normalise_arch",
    "normalise_cuda",
    "not_in_images",
    "parse_cuda_build",
    "platform_arch",
    "platform_family",
    "read_cuda_build",
    "unsupported_platform",
]

#: A CPython version as the matrix spells it: ``3.11``.
PYTHON_VERSION = re.compile(r"3\.\d+")
#: CPU architectures as Linux wheel platform tags end in them (``platform.machine()`` there).
ARCHES: tuple[str, ...] = ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686")
#: The other names machines and tags use for them.
ARCH_ALIASES: dict[str, str] = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "x86-64": "x86_64",
    "arm64": "aarch64",
}
_ARCHES = "|".join(ARCHES)
#: A platform tag the matrix accepts.
PLATFORM_TAG = re.compile(
    rf"(manylinux|musllinux)_\d+_\d+_({_ARCHES})|manylinux(1|2010|2014)_({_ARCHES})"
    rf"|linux_({_ARCHES})|macosx_\d+_\d+_(x86_64|arm64|universal2)|win_amd64|win_arm64|win32"
)

#: The platform tags a target can have. glibc Linux is what the images and the suite run on;
#: musllinux, macOS and Windows rows are resolved for their own tags and markers (a row no
#: wheel fits is ``unsatisfiable`` with the reason) and are served from their locks.
SUPPORTED_PLATFORMS = (
    "manylinux_X_Y_ARCH",
    "manylinux1/2010/2014_ARCH",
    "linux_ARCH",
    "musllinux_X_Y_ARCH",
    "macosx_X_Y_arm64",
    "macosx_X_Y_x86_64",
    "win_amd64",
    "win_arm64",
    "win32",
)

#: The operating systems a platform tag names; ``linux`` is glibc Linux.
PlatformFamily: TypeAlias = Literal["linux", "musllinux", "macos", "windows"]

_CUDA_TAG = re.compile(r"cu(\d{1,2})(\d)")
_CUDA_VERSION = re.compile(r"(\d{1,2})\.(\d)(?:\.\d+)*")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
_LEGACY = re.compile(r"manylinux(1|2010|2014)_(\w+)")
_MUSLLINUX = re.compile(r"musllinux_(\d+)_(\d+)_(\w+)")
_MACOS = re.compile(r"macosx_(\d+)_(\d+)_(arm64|x86_64)")
#: Windows tags -> (``platform.machine()`` there, uv's target triple)
_WINDOWS = {
    "win_amd64": ("AMD64", "x86_64-pc-windows-msvc"),
    "win_arm64": ("ARM64", "aarch64-pc-windows-msvc"),
    "win32": ("x86", "i686-pc-windows-msvc"),
}
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


def cuda_runtime_library_dir(requirement: str, *, windows: bool = False) -> str | None:
    """Where the CUDA runtime wheel *requirement* pins puts its shared libraries, under
    site-packages; None for another project, or ``nvidia-cuda-runtime`` without a pinned
    release (its directory is named after the CUDA major: ``==13.0.96`` -> ``nvidia/cu13/lib``).
    The Windows wheels put their DLLs in ``bin`` instead (``nvidia/cuda_runtime/bin``,
    ``nvidia/cu13/bin/x86_64``)."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return None
    name = canonicalize_name(req.name)
    if _SUFFIXED_RUNTIME.fullmatch(name):
        return "nvidia/cuda_runtime/bin" if windows else "nvidia/cuda_runtime/lib"
    if name != "nvidia-cuda-runtime":
        return None
    for spec in req.specifier:
        if spec.operator in ("==", "==="):
            try:
                major = Version(spec.version.removesuffix(".*")).major
            except InvalidVersion:
                continue
            return f"nvidia/cu{major}/bin/x86_64" if windows else f"nvidia/cu{major}/lib"
    return None


def library_path(
    extra_runtime: Iterable[str], *, python: str, venv: str = "/opt/venv", windows: bool = False
) -> str:
    """``LD_LIBRARY_PATH`` for the CUDA runtimes the resolver added (``add-cuda-runtime``);
    with *windows*, the directories to put on ``PATH`` (``VENV\\Lib\\site-packages``,
    joined by ``;``).

    torch preloads only the CUDA libraries of its own build; an extension built
    for another CUDA major (xformers for CUDA 12 beside a CUDA 13 torch) finds
    ``libcudart.so.12`` only through the loader's path.
    """
    found = (cuda_runtime_library_dir(r, windows=windows) for r in extra_runtime)
    if windows:
        site = PureWindowsPath(venv, "Lib", "site-packages")
        return ";".join(dict.fromkeys(str(site / PureWindowsPath(d)) for d in found if d))
    site_posix = f"{venv}/lib/python{python}/site-packages"
    return ":".join(dict.fromkeys(f"{site_posix}/{d}" for d in found if d))


def unsupported_platform(platform: str) -> str | None:
    """Why a target cannot have the platform tag *platform*, or None when it can."""
    try:
        platform_family(platform)
    except ValueError:
        return (
            f"unsupported target platform {platform!r}: a target is one machine's tag "
            f"({', '.join(SUPPORTED_PLATFORMS)})"
        )
    return None


def platform_family(platform: str) -> PlatformFamily:
    """The operating system *platform* names; a ValueError quoting any other tag
    (``macosx_*_universal2`` included: a target is one machine, arm64 or x86_64)."""
    if platform.startswith(("manylinux", "linux_")):
        _platform_arch(platform)
        return "linux"
    if _MUSLLINUX.fullmatch(platform):
        return "musllinux"
    if _MACOS.fullmatch(platform):
        return "macos"
    if platform in _WINDOWS:
        return "windows"
    raise ValueError(f"unsupported target platform {platform!r}; use e.g. 'manylinux_2_28_x86_64'")


def not_in_images(platform: str) -> str | None:
    """Why a row for *platform* gets no image and no GPU job, or None for glibc Linux.

    The images (``python:*-slim``) and the conformance suite in them are glibc
    Linux; the other rows are resolved and locked, and served from their locks."""
    family = platform_family(platform)
    if family == "linux":
        return None
    where = {
        "windows": "its suite runs in place on a Windows GPU runner (docs/github-actions.md)",
        "macos": "it is served from its lock (query, export, install)",
        "musllinux": "it is served from its lock (query, export, install)",
    }[family]
    return (
        f"images and the conformance suite are glibc Linux; {platform} is a {family} "
        f"target: {where}"
    )


def normalise_arch(arch: str) -> str:
    """``amd64``/``x86-64`` -> ``x86_64``, ``arm64`` -> ``aarch64``; unknown names are refused."""
    text = arch.strip().lower()
    text = ARCH_ALIASES.get(text, text)
    if text not in ARCHES:
        raise InputError(f"bad --arch {arch!r}: give one of {', '.join(ARCHES)} (or amd64, arm64)")
    return text


def platform_arch(tag: str) -> str:
    """The architecture a wheel platform tag names: ``manylinux_2_28_x86_64`` -> ``x86_64``,
    ``manylinux2014_aarch64`` -> ``aarch64``, ``win_amd64`` -> ``x86_64``."""
    for arch in (*ARCHES, *ARCH_ALIASES):
        if tag == arch or tag.endswith("_" + arch):
            return ARCH_ALIASES.get(arch, arch)
    return tag.rsplit("_", 1)[-1]


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
    def family(self) -> PlatformFamily:
        """The operating system of the platform tag."""
        return platform_family(self.platform)

    @cached_property
    def arch(self) -> str:
        """The architecture as the platform tag spells it (``x86_64``, ``arm64``, ``amd64``)."""
        match self.family:
            case "linux":
                return _platform_arch(self.platform)[1]
            case "musllinux":
                return _match(_MUSLLINUX, self.platform).group(3)
            case "macos":
                return _match(_MACOS, self.platform).group(3)
            case "windows":
                return "x86" if self.platform == "win32" else self.platform.removeprefix("win_")

    @cached_property
    def machine(self) -> str:
        """``platform.machine()`` on the target: the ``platform_machine`` marker."""
        if self.family == "windows":
            return _WINDOWS[self.platform][0]
        return self.arch

    @cached_property
    def platforms(self) -> list[str]:
        """Platform tags the target accepts, most specific first.

        A manylinux_2_N target accepts every older manylinux level (and the
        legacy aliases of 2_17, 2_12 and 2_5), then plain ``linux_<arch>``,
        which is how the PyTorch index names many of its wheels. A musllinux_1_N
        target accepts older musllinux levels only: ``linux_<arch>`` wheels are
        glibc builds. A macOS target accepts what pip accepts there (older
        releases, ``universal2``); a Windows target its one tag.
        """
        if self.family == "musllinux":
            m = _match(_MUSLLINUX, self.platform)
            major, top, arch = int(m.group(1)), int(m.group(2)), m.group(3)
            return [f"musllinux_{major}_{minor}_{arch}" for minor in range(top, -1, -1)]
        if self.family == "macos":
            m = _match(_MACOS, self.platform)
            return list(mac_platforms((int(m.group(1)), int(m.group(2))), m.group(3)))
        if self.family == "windows":
            return [self.platform]
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
        """The PEP 508 environment of the target: what its Requires-Dist markers see."""
        full = f"{self.python}.0"
        os_name, system, sys_platform = {
            "linux": ("posix", "Linux", "linux"),
            "musllinux": ("posix", "Linux", "linux"),
            "macos": ("posix", "Darwin", "darwin"),
            "windows": ("nt", "Windows", "win32"),
        }[self.family]
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": os_name,
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": system,
            "platform_version": "",
            "python_full_version": full,
            "python_version": self.python,
            "sys_platform": sys_platform,
            "extra": "",
        }

    @cached_property
    def uv_platform(self) -> str:
        """uv's ``--python-platform`` spelling of the platform tag."""
        match self.family:
            case "windows":
                return _WINDOWS[self.platform][1]
            case "macos":
                return f"{'aarch64' if self.arch == 'arm64' else self.arch}-apple-darwin"
            case "musllinux":
                return f"{self.arch}-unknown-linux-musl"
            case "linux":
                glibc, arch = _platform_arch(self.platform)
                if glibc is None:
                    return f"{arch}-unknown-linux-gnu"
                return f"{arch}-manylinux_{glibc[0]}_{glibc[1]}"

    def describe(self) -> str:
        return f"cp{self.python.replace('.', '')} on {self.platform}"


def _match(pattern: re.Pattern[str], platform: str) -> re.Match[str]:
    if m := pattern.fullmatch(platform):
        return m
    raise ValueError(f"unsupported target platform {platform!r}")
