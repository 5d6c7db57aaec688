"""What names an image and what it is made from: the lock and suite lock it is built
from, the digests of its inputs, its recipe and each layer, and the labels and settings
it carries. Pure but for reading the locks and the recipe (and asking git for the
revision).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envbuilder import __version__
from envbuilder.docker.layers import BaseImage
from envbuilder.docker.manifest import DOCKER_DIR, Manifest
from envbuilder.docker.plan import GROUPS, LayerPlan, LockedWheel, load_lock, lock_digest
from envbuilder.errors import InputError
from envbuilder.model import ResolvedCombination

__all__ = [
    "LABEL_PREFIX",
    "SUITE_GROUP",
    "base_image_for",
    "base_labels",
    "image_labels",
    "image_settings",
    "inputs_digest",
    "layer_key",
    "lock_path",
    "recipe_digest",
    "source_revision",
    "suite_lock_path",
    "suite_wheels",
]

LABEL_PREFIX = "io.envbuilder"
#: The layer of the conformance suite's own dependencies, from the suite lock.
SUITE_GROUP = "suite"


def source_revision(configured: str | None = None) -> str:
    """The source revision envbuilder runs from: the configured one (`Settings.revision`), git, else 'unknown'."""
    if configured:
        return configured
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def image_labels(
    resolved: ResolvedCombination,
    *,
    lock_sha256: str,
    manifest: Manifest,
    base_image: str,
    plan: LayerPlan,
    revision: str,
    version: str = __version__,
    recipe: str = "",
    compiler: Mapping[str, str] | None = None,
    suite: tuple[LockedWheel, ...] = (),
    suite_sha256: str = "",
) -> dict[str, str]:
    """The image's labels: OCI annotations plus the combination, lock, manifest, compiler
    and suite lock."""
    p = LABEL_PREFIX
    in_lock = {w.name: w.version for w in plan.wheels()}
    locked = {name: in_lock.get(name, "") for name in ("torch", "xformers")}
    labels = {
        "org.opencontainers.image.title": f"envbuilder/{resolved.id}",
        "org.opencontainers.image.version": lock_sha256[:12],
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.base.name": base_image,
        f"{p}.version": version,
        f"{p}.combination.id": resolved.id,
        f"{p}.combination.python": resolved.python,
        f"{p}.combination.cuda": resolved.cuda,
        f"{p}.combination.platform": resolved.platform,
        f"{p}.combination.torch": resolved.torch.version if resolved.torch else locked["torch"],
        f"{p}.combination.xformers": (
            resolved.xformers.version if resolved.xformers else locked["xformers"]
        ),
        f"{p}.lock.sha256": lock_sha256,
        f"{p}.recipe.sha256": recipe,
        f"{p}.manifest.sha256": manifest.sha256,
        f"{p}.manifest.files": str(manifest.files),
        f"{p}.layers": ",".join(f"{g}={len(plan.groups[g])}" for g in GROUPS),
    }
    if suite_sha256:  # the suite lock's layer; its wheels that the lock does not hold
        labels[f"{p}.layers"] += f",{SUITE_GROUP}={len(suite)}"
        labels[f"{p}.suite.lock.sha256"] = suite_sha256
        labels[f"{p}.suite.diffusers"] = next(
            (w.version for w in suite if w.name == "diffusers"), ""
        )
    for key, value in (compiler or {}).items():
        labels[f"{p}.compiler.{key}"] = value
    return labels


def lock_path(resolved: ResolvedCombination, locks: Path) -> Path:
    """Where ``resolved``'s lock is: its ``lock`` field, relative to the parent of ``locks`` (docs/contracts.md)."""
    if not resolved.lock:
        raise InputError(
            f"{locks / 'resolution.json'}: combination {resolved.id!r} has no lock; "
            f"run `nox -s resolve -- {resolved.id}`"
        )
    path = Path(resolved.lock)
    return path if path.is_absolute() else locks.parent / path


def suite_lock_path(resolved: ResolvedCombination, lock_path: Path) -> Path | None:
    """The suite lock beside ``lock_path`` that resolution.json names in ``suite_lock``
    (its file name, in the lock's directory); None when the combination has none."""
    if not resolved.suite_lock:
        return None
    return lock_path.parent / Path(resolved.suite_lock).name


def base_image_for(template: str | None, python: str) -> str | None:
    """The base image a matrix row names (``base-image``, its ``{python}`` filled in)."""
    return template.replace("{python}", python) if template else None


def inputs_digest(
    *,
    lock_sha256: str,
    base_id: str,
    recipe: str,
    library_path: str,
    settings: Mapping[str, Any],
    suite_sha256: str = "",
) -> str:
    """sha256 of everything an image is made from: the lock, the suite lock, the base
    image (by id), the recipe and the image's settings (`image_settings`: user, working
    directory, command, labels). A label of the image, for people; reuse checks the image
    itself (``ensure_image``)."""
    document: dict[str, Any] = {
        "lock": lock_sha256,
        "base": base_id,
        "recipe": recipe,
        "library-path": library_path,
        "image": dict(settings),
    }
    if suite_sha256:
        document["suite"] = suite_sha256
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


#: Who runs an image's command, where, and what it runs by default.
IMAGE_USER = "10001:10001"
IMAGE_WORKDIR = "/home/envbuilder"
IMAGE_CMD: tuple[str, ...] = ("python",)


def image_settings(labels: Mapping[str, str]) -> dict[str, Any]:
    """The image's own settings, as its config holds them and `inputs_digest` takes them."""
    return {"user": IMAGE_USER, "workdir": IMAGE_WORKDIR, "cmd": list(IMAGE_CMD), "labels": dict(labels)}  # fmt: skip


def base_labels(base: BaseImage) -> dict[str, str]:
    """What the image says of its base: the OCI ``base.digest`` (a manifest digest, only
    where the base came from a registry) and the base image's id."""
    labels = {f"{LABEL_PREFIX}.base.id": base.id}
    if base.digest:
        labels["org.opencontainers.image.base.digest"] = base.digest
    return labels


def suite_wheels(
    resolved: ResolvedCombination, lock_path: Path, plan: LayerPlan
) -> tuple[tuple[LockedWheel, ...], str]:
    """The suite lock's wheels that the combination's lock does not already install, and the
    suite lock's sha256 ("" without one). A project locked at two versions is refused."""
    path = suite_lock_path(resolved, lock_path)
    if path is None:
        return (), ""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(
            f"cannot read the suite lock {str(path)!r} ({e.strerror}); run `nox -s resolve` again"
        ) from e
    in_lock = {w.name: w for w in plan.wheels()}
    extra: list[LockedWheel] = []
    for wheel in load_lock(data, source=path, python=resolved.python):
        locked = in_lock.get(wheel.name)
        if locked is None:
            extra.append(wheel)
        elif locked.sha256 != wheel.sha256:
            raise InputError(
                f"{path}: {wheel.name} {wheel.version} ({wheel.filename}) differs from "
                f"{locked.filename} in {lock_path.name}; the suite lock must be resolved with "
                "the combination's lock as constraints (`nox -s resolve` again)"
            )
    return tuple(sorted(extra, key=lambda w: (w.name, w.filename))), lock_digest(data)


def layer_key(name: str, requirements: str, *, base_id: str, recipe: str) -> str:
    """What a layer's bytes depend on: its wheels, the base's Python (by base id), the recipe."""
    document = {"layer": name, "requirements": requirements, "base": base_id, "recipe": recipe}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def recipe_digest() -> str:
    """sha256 of the recipe: the in-container installer and the code that writes layers and
    config. An image with the lock's tag is up to date only when the same recipe made it."""
    digest = hashlib.sha256()
    scripts = ("install-group.sh", "bytecode.py", "install-compiler.sh")
    for path in (*(DOCKER_DIR / n for n in scripts), Path(__file__).with_name("layers.py")):
        digest.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    return digest.hexdigest()
