"""Build one image per combination from its lock, through the Docker SDK.

``ensure_image`` is the entry point: it returns ``envbuilder/<id>:<lock
sha256[:12]>``, building only when no image has that tag (or when forced).
A build fetches and verifies the lock's wheels into the host's wheel cache,
links exactly those wheels into a fresh build context, builds
``docker/Dockerfile`` with network ``none`` (the installer inside checks
every hash again), measures the installed tree, and tags the image with
labels that carry the combination, the lock hash and the manifest hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envbuilder import __version__
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import (
    GROUPS,
    LayerPlan,
    image_tag,
    install_requirements,
    library_path,
    load_lock,
    lock_digest,
    plan_layers,
)
from envbuilder.errors import EnvbuilderError, InputError, MissingToolError
from envbuilder.model import ResolvedCombination
from envbuilder.reporter import Reporter

__all__ = [
    "DOCKER_DIR",
    "LABEL_PREFIX",
    "BuildFailed",
    "Manifest",
    "build_context",
    "docker_build",
    "docker_client",
    "ensure_image",
    "image_labels",
    "label_dockerfile",
    "lock_path",
    "measure_manifest",
    "push_image",
    "source_revision",
]

logger = logging.getLogger(__name__)

#: Dockerfile, in-image install helper and manifest script (the repository's ``docker/``).
DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
LABEL_PREFIX = "io.envbuilder"
VENV = "/opt/venv"
_API_TIMEOUT_S = 3600  # a torch layer can take minutes without output


class BuildFailed(EnvbuilderError):
    """The Docker build of a combination failed; the message names its log file."""


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """Hash of the installed tree (sorted paths + file sha256, no bytecode)."""

    sha256: str
    files: int


def docker_client(client: Any = None) -> Any:
    """The given client, or one from the environment that answers a ping."""
    if client is not None:
        return client
    from docker.client import DockerClient
    from docker.errors import DockerException

    try:
        found = DockerClient.from_env(timeout=_API_TIMEOUT_S)
        found.ping()
    except DockerException as e:
        raise MissingToolError(
            f"no Docker daemon answered ({e}); start one with `sudo bash .ci/setup` "
            "(installs and starts Docker) or run `dockerd` yourself, or point DOCKER_HOST at one"
        ) from e
    return found


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
) -> dict[str, str]:
    """The image's labels: OCI annotations plus the combination, lock and manifest."""
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


def ensure_image(
    resolved: ResolvedCombination,
    lock_path: Path,
    *,
    client: Any = None,
    force: bool = False,
    base_image: str | None = None,
    reporter: Reporter | None = None,
    log_dir: Path,
    cache: WheelCache,
    revision: str | None = None,
    no_cache: bool = False,
) -> str:
    """The tag of the combination's image, built from ``lock_path`` unless it exists already.

    ``force`` rebuilds (through Docker's layer cache unless ``no_cache``).
    ``base_image`` defaults to ``python:<python>-slim``.
    """
    reporter = reporter or Reporter()
    if resolved.status != "resolved":
        raise InputError(
            f"combination {resolved.id!r} is {resolved.status} ({resolved.reason}); nothing to build"
        )
    try:
        lock_bytes = lock_path.read_bytes()
    except OSError as e:
        raise InputError(
            f"cannot read lock {str(lock_path)!r} ({e.strerror}); run `nox -s resolve`"
        ) from e
    lock_sha256 = lock_digest(lock_bytes)
    if resolved.lock_sha256 and resolved.lock_sha256 != lock_sha256:
        raise InputError(
            f"{lock_path}: sha256 {lock_sha256!r} differs from {resolved.lock_sha256!r} in the "
            "resolution; the lock changed after resolving, run `nox -s resolve` again"
        )
    tag = image_tag(resolved.id, lock_sha256)
    client = docker_client(client)
    recipe = recipe_digest()
    if not force:
        built_by = _image_recipe(client, tag)
        if built_by == recipe:
            reporter.line(f"✓ {tag} exists (same lock, same recipe); not rebuilt")
            return tag
        if built_by is not None:
            reporter.line(f"{tag} was built by another Dockerfile of envbuilder's; rebuilding")
    plan = plan_layers(load_lock(lock_bytes, source=lock_path))
    base = base_image or f"python:{resolved.python}-slim"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{resolved.id}.log"
    with reporter.step(f"build {tag}"), log_path.open("w", encoding="utf-8") as log:
        reporter.detail(f"layers: {plan.describe()}; base image {base}; log {log_path}")
        _ensure_base(client, base, reporter)
        with reporter.step(f"fetch {len(plan.wheels())} wheel(s) into {cache.root}"):
            for wheel in plan.wheels():
                cache.fetch(wheel)
        with build_context(plan, cache) as context:
            image_id = docker_build(
                client,
                path=str(context),
                buildargs={
                    "BASE_IMAGE": base,
                    "PYTHON_VERSION": resolved.python,
                    "LIBRARY_PATH": library_path(resolved.extra_runtime, python=resolved.python),
                },
                nocache=no_cache,
                log=log,
                log_path=log_path,
                reporter=reporter,
            )
        manifest = measure_manifest(client, image_id)
        reporter.detail(f"manifest sha256 {manifest.sha256} ({manifest.files} files)")
        labels = image_labels(
            resolved,
            lock_sha256=lock_sha256,
            manifest=manifest,
            base_image=base,
            plan=plan,
            revision=source_revision(revision),
            recipe=recipe,
        )
        docker_build(
            client,
            fileobj=io.BytesIO(label_dockerfile(image_id, labels).encode()),
            tag=tag,
            log=log,
            log_path=log_path,
            reporter=reporter,
        )
    return tag


def label_dockerfile(image_id: str, labels: Mapping[str, str]) -> str:
    """A Dockerfile that only labels ``image_id``: one LABEL instruction, one history entry."""

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'

    pairs = " \\\n    ".join(f"{quoted(k)}={quoted(v)}" for k, v in sorted(labels.items()))
    return f"FROM {image_id}\nLABEL {pairs}\n"


def recipe_digest() -> str:
    """sha256 of the build recipe (Dockerfile and its helper): an image with the lock's
    tag is up to date only when the same recipe built it."""
    digest = hashlib.sha256()
    for name in ("Dockerfile", "install-group.sh"):
        path = DOCKER_DIR / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    return digest.hexdigest()


def _image_recipe(client: Any, ref: str) -> str | None:
    """The recipe label of the image ``ref``; "" when it has none; None when there is no image."""
    from docker.errors import ImageNotFound

    try:
        image = client.images.get(ref)
    except ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return str(labels.get(f"{LABEL_PREFIX}.recipe.sha256", ""))


def _image_exists(client: Any, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(ref)
    except ImageNotFound:
        return False
    return True


def _ensure_base(client: Any, base: str, reporter: Reporter) -> None:
    if _image_exists(client, base):
        return
    from docker.errors import DockerException

    reporter.line(f"+ docker pull {base}")
    try:
        client.images.pull(base)
    except DockerException as e:
        raise MissingToolError(
            f"base image {base!r} is not on this machine and could not be pulled ({e}); "
            "pull or build it first (docker/make-base.sh makes a local Debian one), "
            "or choose another with base-image in matrix.toml / --base-image"
        ) from e


@contextmanager
def build_context(plan: LayerPlan, cache: WheelCache) -> Iterator[Path]:
    """A build context with the Dockerfile, its helpers and exactly the lock's wheels."""
    if not (DOCKER_DIR / "Dockerfile").is_file():
        raise MissingToolError(
            f"{DOCKER_DIR / 'Dockerfile'} is missing; envbuilder builds images from a source checkout"
        )
    with tempfile.TemporaryDirectory(prefix="envbuilder-context-", dir=cache.root) as tmp:
        root = Path(tmp)
        for name in ("Dockerfile", "install-group.sh"):
            shutil.copyfile(DOCKER_DIR / name, root / name)
        for group in GROUPS:
            directory = root / "wheels" / group
            directory.mkdir(parents=True)
            for wheel in plan.groups[group]:
                cache.link_into(wheel, directory)
            (directory / "requirements.txt").write_text(
                install_requirements(plan.groups[group]), encoding="utf-8"
            )
        yield root


def docker_build(
    client: Any,
    *,
    log: IO[str],
    log_path: Path,
    reporter: Reporter,
    **kwargs: Any,
) -> str:
    """Run one legacy-builder build, streaming its output; the image id it produced."""
    from docker.errors import APIError

    image_id: str | None = None
    try:
        stream: Iterable[Mapping[str, Any]] = client.api.build(
            rm=True, forcerm=True, pull=False, network_mode="none", decode=True, **kwargs
        )
        for item in stream:
            if "stream" in item:
                text = str(item["stream"])
                log.write(text)
                for line in text.splitlines():
                    if line.startswith("Step "):
                        reporter.line(f"    {line}")
                    elif line.strip():
                        reporter.detail(line)
            if "error" in item:
                log.write(f"ERROR: {item['error']}\n")
                log.flush()
                raise BuildFailed(
                    f"docker build failed: {item['error'].strip()} (full log: {log_path})"
                )
            aux = item.get("aux")
            if isinstance(aux, Mapping) and "ID" in aux:
                image_id = str(aux["ID"])
    except APIError as e:
        raise BuildFailed(f"docker build failed: {e} (full log: {log_path})") from e
    log.flush()
    if image_id is None:
        raise BuildFailed(f"docker build reported no image id (full log: {log_path})")
    return image_id


def measure_manifest(client: Any, image: str) -> Manifest:
    """Run ``docker/manifest.py`` in a container of ``image`` over its venv."""
    script = (DOCKER_DIR / "manifest.py").read_text(encoding="utf-8")
    out = client.containers.run(
        image,
        ["python3", "-c", script, VENV],
        network_mode="none",
        remove=True,
        stdout=True,
        stderr=False,
    )
    data = json.loads(out)
    return Manifest(sha256=str(data["sha256"]), files=int(data["files"]))


def push_image(client: Any, tag: str, registry: str, *, reporter: Reporter | None = None) -> str:
    """Push ``tag`` as ``<registry>/<tag>``; the pushed reference."""
    reporter = reporter or Reporter()
    remote = f"{registry.rstrip('/')}/{tag}"
    repository, _, version = remote.rpartition(":")
    client.images.get(tag).tag(repository, version)
    with reporter.step(f"push {remote}"):
        for item in client.api.push(repository, tag=version, stream=True, decode=True):
            if "error" in item:
                raise BuildFailed(f"docker push {remote} failed: {item['error']}")
            status = item.get("status")
            if status and item.get("id") is None:
                reporter.detail(str(status))
    return remote
