"""Build real wheel files for tests.

``build_wheel(tmp_path, "xformers", "0.0.28.post1", tags="cp311-cp311-manylinux_2_28_x86_64",
requires_dist=["torch==2.4.1"], members={"xformers/cpp_lib.json": b"{...}"},
padding=20 * 2**20)`` writes a valid wheel: ``.dist-info/METADATA``, ``WHEEL``
and a ``RECORD`` with sha256 of every member. ``padding`` adds a member of
incompressible bytes stored uncompressed, to make the wheel as large as a
real torch or xformers wheel without generating gigabytes.
"""

from __future__ import annotations

import base64
import hashlib
import random
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

__all__ = ["BuiltWheel", "build_wheel", "cpp_lib_json", "wheel_filename"]


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    """A wheel on disk and the facts an index lists about it."""

    path: Path
    name: str  # canonical project name
    version: str
    filename: str
    sha256: str
    size: int
    metadata: bytes  # the exact METADATA member, for PEP 658 `.metadata` files
    requires_python: str | None


def _escape(name: str) -> str:
    return canonicalize_name(name).replace("-", "_")


def wheel_filename(
    name: str, version: str, tags: str = "py3-none-any", build: str | None = None
) -> str:
    middle = f"{version}-{build}" if build else version
    return f"{_escape(name)}-{middle}-{tags}.whl"


def cpp_lib_json(
    *, torch: str, cuda: int | None, arch_list: str | None, python: str = "3.11.10"
) -> bytes:
    """An ``xformers/cpp_lib.json`` shaped like the real ones (cuda as 1201 for 12.1)."""
    import json

    return json.dumps(
        {
            "version": {"cuda": cuda, "hip": None, "torch": torch, "python": python},
            "env": {"TORCH_CUDA_ARCH_LIST": arch_list, "XFORMERS_BUILD_TYPE": "Release"},
        }
    ).encode()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(
    directory: Path,
    name: str,
    version: str,
    *,
    tags: str = "py3-none-any",
    requires_dist: Iterable[str] = (),
    requires_python: str | None = None,
    members: Mapping[str, bytes] | None = None,
    padding: int = 0,
    build: str | None = None,
    seed: int = 0,
) -> BuiltWheel:
    """Write a valid wheel into ``directory`` and describe it."""
    directory.mkdir(parents=True, exist_ok=True)
    filename = wheel_filename(name, version, tags, build)
    dist_info = f"{_escape(name)}-{version}.dist-info"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {req}" for req in requires_dist]
    metadata = ("\n".join(lines) + "\n\n").encode()
    is_pure = tags.endswith("-none-any")
    wheel_lines = [
        "Wheel-Version: 1.0",
        "Generator: envbuilder-tests",
        f"Root-Is-Purelib: {'true' if is_pure else 'false'}",
    ]
    py, abi, plats = tags.split("-")
    wheel_lines += [
        f"Tag: {p}-{a}-{pl}"
        for p in py.split(".")
        for a in abi.split(".")
        for pl in plats.split(".")
    ]
    if build:
        wheel_lines.append(f"Build: {build}")
    contents: dict[str, bytes] = {
        f"{_escape(name)}/__init__.py": f'__version__ = "{version}"\n'.encode()
    }
    contents.update(members or {})
    contents[f"{dist_info}/METADATA"] = metadata
    contents[f"{dist_info}/WHEEL"] = ("\n".join(wheel_lines) + "\n").encode()
    padding_name = f"{_escape(name)}/_padding.bin"
    padding_bytes = random.Random(seed).randbytes(padding) if padding else b""
    record_lines = [f"{n},{_record_hash(d)},{len(d)}" for n, d in contents.items()]
    if padding:
        record_lines.append(f"{padding_name},{_record_hash(padding_bytes)},{len(padding_bytes)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    path = directory / filename
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            if not member.startswith(dist_info):
                archive.writestr(member, data)
        if padding:
            # Uncompressed, so the wheel is as large as asked; before the metadata, as in real wheels.
            archive.writestr(padding_name, padding_bytes, compress_type=zipfile.ZIP_STORED)
        for member, data in contents.items():
            if member.startswith(dist_info):
                archive.writestr(member, data)
        archive.writestr(f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode())
    tmp.replace(path)
    data = path.read_bytes()
    return BuiltWheel(
        path=path,
        name=str(canonicalize_name(name)),
        version=version,
        filename=filename,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        metadata=metadata,
        requires_python=requires_python,
    )
