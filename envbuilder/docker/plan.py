"""The layer plan: which of a lock's wheels go into which image layer.

Pure functions over a PEP 751 lock. Combinations share a layer when it and
every layer below it hold the same wheels, because a layer's content is
decided by the lock alone. Layers, in order:

1. ``cuda``: the CUDA toolkit's libraries (``nvidia-*`` such as cuBLAS,
   cuDNN, cuFFT, NVRTC, the CUDA runtime) and ``cuda-toolkit``. They are
   versioned with the toolkit release, so the torch releases built for one
   CUDA minor pin the same files (torch 2.8, 2.9 and 2.10 for CUDA 12.8 all
   pin cuBLAS 12.8.4.1, cuDNN 9.10.2.21, …): this is the big shared layer.
2. ``runtime``: the rest of the CUDA runtime, which moves with each torch
   release (NCCL, NVSHMEM, ``cuda-bindings``, ``cuda-pathfinder``).
3. ``torch``: torch and triton.
4. ``libs``: the pure-Python libraries torch requires (sympy, networkx, jinja2,
   fsspec, …) and theirs (mpmath, MarkupSafe). They are most of what a
   ``rest`` would hold (84 MB of the CPU torch image's), and they move with torch
   and their own releases, not with xformers or the matrix's extras.
5. ``rest``: xformers and everything else: a change here (an extra added, another
   xformers build) installs and sends only this layer and the suite's above it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuilder.errors import InputError
from envbuilder.model import image_tag
from envbuilder.pylock import packages, read_lock, requirements_text
from envbuilder.target import library_path

__all__ = [
    "GROUPS",
    "Group",
    "LayerPlan",
    "LockedWheel",
    "group_of",
    "image_tag",
    "install_requirements",
    "library_path",
    "load_lock",
    "lock_digest",
    "plan_layers",
    "with_built_wheel",
]

Group = Literal["cuda", "runtime", "torch", "libs", "rest"]

#: Layer order in the image: the biggest and most widely shared content first.
GROUPS: tuple[Group, ...] = ("cuda", "runtime", "torch", "libs", "rest")

_RUNTIME_PREFIXES = ("nvidia-", "cuda-")
#: CUDA runtime projects released on their own cadence, not with the toolkit.
_OWN_CADENCE = (
    "nvidia-nccl-",
    "nvidia-nvshmem-",
    "cuda-bindings",
    "cuda-pathfinder",
    "cuda-python",
)
_TORCH_PROJECTS = frozenset({"torch", "triton", "pytorch-triton"})
#: What torch's wheels (2.4 to 2.13) require beyond the CUDA runtime and triton, and what
#: those require in turn.
_TORCH_LIBRARIES = frozenset(
    {
        "filelock",
        "fsspec",
        "jinja2",
        "markupsafe",
        "mpmath",
        "networkx",
        "setuptools",
        "sympy",
        "typing-extensions",
    }
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, kw_only=True)
class LockedWheel:
    """One wheel of a lock: what to fetch and the hash it must have."""

    name: str  # canonical project name
    version: str
    filename: str
    url: str  # http(s):// or file://
    sha256: str
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class LayerPlan:
    """The lock's wheels split into the image's install layers, in ``GROUPS`` order."""

    groups: Mapping[Group, tuple[LockedWheel, ...]]

    def wheels(self) -> tuple[LockedWheel, ...]:
        return tuple(w for g in GROUPS for w in self.groups[g])

    def describe(self) -> str:
        return ", ".join(f"{g}: {len(self.groups[g])} wheel(s)" for g in GROUPS)


def group_of(name: str) -> Group:
    """The layer a project's wheel belongs to."""
    canonical = canonicalize_name(name)
    if canonical.startswith(_OWN_CADENCE):
        return "runtime"
    if canonical.startswith("nvidia-") or canonical == "cuda-toolkit":
        return "cuda"
    if canonical.startswith(_RUNTIME_PREFIXES):
        return "runtime"
    if canonical in _TORCH_PROJECTS:
        return "torch"
    if canonical in _TORCH_LIBRARIES:
        return "libs"
    return "rest"


def plan_layers(wheels: Sequence[LockedWheel]) -> LayerPlan:
    """Group wheels by layer; within a layer they are sorted by name so the order is the lock's content, not its layout."""
    grouped: dict[Group, list[LockedWheel]] = {g: [] for g in GROUPS}
    for wheel in wheels:
        grouped[group_of(wheel.name)].append(wheel)
    return LayerPlan(
        groups={
            g: tuple(sorted(ws, key=lambda w: (w.name, w.filename))) for g, ws in grouped.items()
        }
    )


def with_built_wheel(
    wheels: Sequence[LockedWheel], built: LockedWheel | None
) -> tuple[LockedWheel, ...]:
    """The lock's wheels and, for a source build, the built wheel its build record names
    (installed hash-pinned like the rest; a source build's lock never holds that project)."""
    if built is None:
        return tuple(wheels)
    clash = [w.filename for w in wheels if w.name == built.name]
    if clash:
        raise InputError(
            f"the lock holds {', '.join(clash)} and the source build makes {built.filename}: "
            f"one {built.name} only; resolve again (`nox -s resolve`)"
        )
    return (*wheels, built)


def install_requirements(wheels: Sequence[LockedWheel]) -> str:
    """A ``pip install --require-hashes --no-deps`` requirements file for exactly these wheels."""
    return requirements_text(((f"{w.name}=={w.version}", w.sha256) for w in wheels), wrap=False)


def load_lock(data: bytes, *, source: Path, python: str | None = None) -> tuple[LockedWheel, ...]:
    """The wheels of a PEP 751 lock. Every package must be exactly one wheel with a sha256.

    ``source`` is the lock's path: it names the file in errors and anchors
    relative ``path`` entries. With ``python`` (the target's ``X.Y``), a package's
    marker is evaluated for CPython ``python`` on Linux x86_64 and the package is left
    out where it is false; without, a marker is refused.
    """
    wheels: list[LockedWheel] = []
    for package in packages(read_lock(data, source=source), source=source):
        where = f"{source}: package {package.name!r}"
        if package.marker is not None and python is not None:
            if not _marker_holds(package.marker, python, where=where):
                continue
        elif package.marker is not None:
            raise InputError(
                f"{where} has marker {package.marker!r}; envbuilder builds from locks for one target "
                "(resolve with --python-version/--python-platform)"
            )
        if len(package.wheels) != 1:
            raise InputError(
                f"{where} has {len(package.wheels)} wheel(s); a target's lock must pin exactly one wheel "
                "(source distributions are not built into images)"
            )
        wheel = package.wheels[0]
        url = wheel.location(source)
        if url is None:
            raise InputError(f"{where}: its wheel has neither url nor path")
        filename = wheel.filename
        try:
            parsed_name = parse_wheel_filename(filename)[0]
        except InvalidWheelFilename as e:
            raise InputError(f"{where}: {filename!r} is not a wheel file name") from e
        if parsed_name != canonicalize_name(package.name):
            raise InputError(f"{where}: wheel {filename!r} is for project {parsed_name!r}")
        sha256 = (wheel.sha256 or "").lower()
        if not _SHA256.match(sha256):
            raise InputError(
                f"{where}: wheel {filename!r} has no sha256 hash; re-resolve with --generate-hashes"
            )
        if package.version is None:
            raise InputError(f"{where}: no version")
        wheels.append(
            LockedWheel(
                name=canonicalize_name(package.name),
                version=package.version,
                filename=filename,
                url=url,
                sha256=sha256,
                size=wheel.size,
            )
        )
    if not wheels:
        raise InputError(f"{source}: the lock has no packages")
    return tuple(wheels)


def _marker_holds(marker: str, python: str, *, where: str) -> bool:
    from packaging.markers import InvalidMarker, Marker

    try:
        parsed = Marker(marker)
    except InvalidMarker as e:
        raise InputError(f"{where} has an invalid marker {marker!r}") from e
    environment = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
    }
    return parsed.evaluate(environment)


def lock_digest(data: bytes) -> str:
    """The lock's sha256 as ``resolution.json`` records it: over the file's bytes."""
    return hashlib.sha256(data).hexdigest()
