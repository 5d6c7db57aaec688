"""The manifest of an image's venv: the files it holds, hashed in sorted order
(``envbuilder/docker/recipe/manifest.py`` computes it, on the host over a layer's
tree or in a container of the image), and where in the image it looks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.docker.client import DockerClient
from envbuilder.errors import MissingToolError

__all__ = [
    "COMPILER_RECORD_DIR",
    "DOCKER_DIR",
    "VENV",
    "Manifest",
    "manifest_entries",
    "manifest_of",
    "measure_manifest",
]

#: In-image install script and manifest script (the repository's ``docker/``).
#: the scripts a build runs inside containers; package data, so an installed wheel builds too
DOCKER_DIR = Path(__file__).resolve().with_name("recipe")
VENV = "/opt/venv"
#: Where the compiler layer records what it installed (``compiler.txt``), in the image.
COMPILER_RECORD_DIR = "/usr/share/envbuilder"


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """Hash of the installed tree (sorted paths + file sha256, no bytecode)."""

    sha256: str
    files: int


def _manifest_module() -> Any:
    spec = importlib.util.spec_from_file_location("envbuilder_manifest", DOCKER_DIR / "manifest.py")
    if spec is None or spec.loader is None:
        raise MissingToolError(
            f"{DOCKER_DIR / 'manifest.py'} is missing; the installation is incomplete: reinstall gpu-envbuilder"
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manifest_entries(root: Path, *, prefix: str = "") -> list[tuple[str, str, str]]:
    """The manifest entries (``envbuilder/docker/recipe/manifest.py``) of the tree under
    ``root``, if any; paths under ``prefix`` when given (the image's absolute path)."""
    if not root.is_dir():
        return []
    return [tuple(e) for e in _manifest_module().entries(str(root), prefix)]


def manifest_of(layers: Iterable[Iterable[tuple[str, str, str]]]) -> Manifest:
    """The manifest of the venv that layers stacked bottom to top make (an upper entry wins)."""
    merged: dict[str, tuple[str, str]] = {}
    for entries in layers:
        for rel, kind, value in entries:
            merged[rel] = (kind, value)
    total = hashlib.sha256()
    for rel in sorted(merged):
        kind, value = merged[rel]
        total.update(f"{rel}\0{kind}\0{value}\n".encode("utf-8", "surrogateescape"))
    return Manifest(
        sha256=total.hexdigest(), files=sum(1 for k, _ in merged.values() if k.startswith("file"))
    )


def measure_manifest(client: DockerClient, image: str) -> Manifest:
    """Run ``envbuilder/docker/recipe/manifest.py`` in a container of ``image`` over its venv
    and the compiler's record."""
    script = (DOCKER_DIR / "manifest.py").read_text(encoding="utf-8")
    out = client.containers.run(
        image,
        ["python3", "-c", script, VENV, COMPILER_RECORD_DIR],
        network_mode="none",
        remove=True,
        stdout=True,
        stderr=False,
    )
    data = json.loads(out)
    return Manifest(sha256=str(data["sha256"]), files=int(data["files"]))
