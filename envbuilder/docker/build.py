"""Build one image per combination from its lock, without ``docker build``.

``ensure_image`` is the entry point: it returns ``envbuilder/<id>:<lock
sha256[:12]>``, building only when no image with that tag was made from the
same inputs: the lock, the base image (by id) and the recipe.

A build checks the base's Python first, then makes only the layers the layer
cache does not hold: it fetches and verifies those wheels into the host's
wheel cache, mounts hard links of them read-only into one container of the
base image (network ``none``), where ``envbuilder/docker/recipe/install-group.sh`` installs each
group with pip (checking every hash again) and byte-compiles it. The host
writes each installed tree as a reproducible layer tar and the image config
(``layers.py``), and ``docker load``s them, leaving out layers the daemon has.
Nothing is sent as a build context, no build stage or dangling image is left,
and the same inputs give the same layers and image id on any machine.

Two layers come from outside the combination's lock. Right above the base,
``compiler``: Debian's gcc, g++ and libc headers, installed by
``install-compiler.sh`` with the base's own apt (triton compiles its launcher
and inductor its CPU kernels with them; OpenMP's ``omp.h`` rules out a
compiler from wheels such as ``ziglang``). It is the one step with network,
made once per base image and shared by every combination of that base; its
packages and compiler version are recorded in the image. On top, ``suite``:
the conformance suite's own dependencies (diffusers and its closure) from the
suite lock beside the combination's lock, when there is one.

An existing image is never trusted by its tag or labels: it is reused only
when its id (the sha256 of its config, which lists every layer's digest) is
the one this build would make from the layer cache's records of the same
inputs; otherwise it is made again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envbuilder import __version__
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.client import DockerClient, DockerContainer
from envbuilder.docker.layers import (
    BaseImage,
    Layer,
    archive_chunks,
    chain_ids,
    image_config,
    image_env,
    image_id,
    write_layer,
)
from envbuilder.docker.plan import (
    GROUPS,
    LayerPlan,
    LockedWheel,
    image_tag,
    install_requirements,
    library_path,
    load_lock,
    lock_digest,
    plan_layers,
    with_built_wheel,
)
from envbuilder.errors import EnvbuilderError, InputError, MissingToolError
from envbuilder.files import write_atomic
from envbuilder.model import ResolvedCombination
from envbuilder.reporter import Reporter

__all__ = [
    "COMPILER_PACKAGES",
    "DOCKER_DIR",
    "LABEL_PREFIX",
    "LAYERS",
    "SUITE_GROUP",
    "BuildFailed",
    "ImageRequest",
    "Manifest",
    "base_image_for",
    "docker_client",
    "ensure_image",
    "image_labels",
    "inputs_digest",
    "link_wheels",
    "lock_path",
    "measure_manifest",
    "push_image",
    "recipe_digest",
    "source_revision",
    "suite_lock_path",
]

logger = logging.getLogger(__name__)

#: In-image install script and manifest script (the repository's ``docker/``).
#: the scripts a build runs inside containers; package data, so an installed wheel builds too
DOCKER_DIR = Path(__file__).resolve().with_name("recipe")
LABEL_PREFIX = "io.envbuilder"
VENV = "/opt/venv"
_API_TIMEOUT_S = 3600  # loading a torch layer can take minutes without output
#: For the ping and the calls that answer at once (inspect, list, create): a daemon that
#: accepts the connection and never answers is an error after this, not a hang.
_QUICK_TIMEOUT_S = 60
#: Debian packages of the ``compiler`` layer: ``gcc`` for triton's launcher (``cc``), ``g++``
#: for inductor's CPU kernels (with OpenMP from libgcc), the C library's headers for both.
COMPILER_PACKAGES: tuple[str, ...] = ("gcc", "g++", "libc6-dev")
#: The network of the container that installs the compiler: the host's, so that apt reaches
#: the mirror the base names even where the bridge network has no name resolution.
_COMPILER_NETWORK = "host"
#: Where the compiler layer records what it installed (``compiler.txt``), in the image.
COMPILER_RECORD_DIR = "/usr/share/envbuilder"
#: The layer of the conformance suite's own dependencies, from the suite lock.
SUITE_GROUP = "suite"


class BuildFailed(EnvbuilderError):
    """The Docker build of a combination failed; the message names its log file."""


class LayerGone(BuildFailed):
    """A layer left out of ``docker load`` because the daemon had it is no longer there."""


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """Hash of the installed tree (sorted paths + file sha256, no bytecode)."""

    sha256: str
    files: int


def docker_client(
    client: DockerClient | None = None, *, quick_timeout_s: float | None = None
) -> DockerClient:
    """The given client, or one from the environment that answers a ping within
    ``quick_timeout_s`` (default `_QUICK_TIMEOUT_S`; a daemon that accepts the connection and never answers is an
    error, not a hang). Its other calls may wait `_API_TIMEOUT_S`; `_quick` shortens them."""
    if client is not None:
        return client
    quick_timeout_s = _QUICK_TIMEOUT_S if quick_timeout_s is None else quick_timeout_s
    import requests
    from docker import client as docker_py
    from docker.errors import DockerException

    try:
        found: DockerClient = docker_py.DockerClient.from_env(timeout=quick_timeout_s)
        found.ping()
    except (DockerException, requests.exceptions.RequestException) as e:
        raise MissingToolError(
            f"no Docker daemon answered within {quick_timeout_s:g} s ({e}); start one with "
            "`sudo bash .ci/setup` (installs and starts Docker) or run `dockerd` yourself, "
            "or point DOCKER_HOST at one"
        ) from e
    found.api.timeout = _API_TIMEOUT_S
    return found


@contextmanager
def _quick(client: DockerClient) -> Iterator[None]:
    """Calls inside give up after `_QUICK_TIMEOUT_S` (inspect, list: the daemon answers at once)."""
    api = getattr(client, "api", None)
    before = getattr(api, "timeout", None)
    if not isinstance(before, (int, float)) or before <= _QUICK_TIMEOUT_S:
        yield
        return
    api.timeout = _QUICK_TIMEOUT_S  # type: ignore[union-attr]
    try:
        yield
    finally:
        api.timeout = before  # type: ignore[union-attr]


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


@dataclass(frozen=True, kw_only=True)
class ImageRequest:
    """What `ensure_image` makes: the image of one resolved combination, from its lock.

    ``force`` rebuilds, reusing the layers recorded in the layer cache unless
    ``no_cache``; either way every layer is the same bytes. ``base_image``
    defaults to ``python:<python>-slim``. ``keep_stages`` keeps the installed
    trees and layer tars (for debugging) and names their directory. The build's
    log goes to ``log_dir``; wheels come through ``cache``. A source-build combination's
    image installs ``built_wheel``, the wheel its build record pins
    (`envbuilder.sourcebuild.image.image_wheel`); the image build never compiles one.
    """

    resolved: ResolvedCombination
    lock_path: Path
    log_dir: Path
    cache: WheelCache
    base_image: str | None = None
    revision: str | None = None
    force: bool = False
    no_cache: bool = False
    keep_stages: bool = False
    built_wheel: LockedWheel | None = None


def ensure_image(
    request: ImageRequest,
    *,
    client: DockerClient | None = None,
    reporter: Reporter | None = None,
) -> str:
    """The tag of the combination's image, built from the request's lock unless an image
    with that tag was made from the same inputs (lock, base image id, recipe)."""
    resolved, lock_path, cache = request.resolved, request.lock_path, request.cache
    force, no_cache, base_image = request.force, request.no_cache, request.base_image
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
    if resolved.source_build is not None and request.built_wheel is None:
        raise InputError(
            f"{resolved.id} builds xformers from source, and no built wheel was given for its "
            "image; an image build never compiles xformers itself: `envbuilder build` takes "
            "the wheel its build record pins"
        )
    plan = plan_layers(
        with_built_wheel(load_lock(lock_bytes, source=lock_path), request.built_wheel)
    )
    suite, suite_sha256 = _suite_wheels(resolved, lock_path, plan)
    client = docker_client(client)
    base_ref = base_image or f"python:{resolved.python}-slim"
    _ensure_base(client, base_ref, reporter)
    base = inspect_base(client, base_ref)
    library = library_path(resolved.extra_runtime, python=resolved.python)
    recipe = recipe_digest()
    what = Inputs(
        resolved=resolved,
        plan=plan,
        suite=suite,
        suite_sha256=suite_sha256,
        base=base,
        lock_sha256=lock_sha256,
        recipe=recipe,
        inputs="",
        library_path=library,
        revision=request.revision,
    )
    what = dataclasses.replace(
        what,
        inputs=inputs_digest(
            lock_sha256=lock_sha256,
            base_id=base.id,
            recipe=recipe,
            library_path=library,
            settings=image_settings(_labels(what, None)),
            suite_sha256=suite_sha256,
        ),
    )
    if not force:
        found = _image_id(client, tag)
        if found is not None:
            doubt = _doubt(client, found, what, LayerCache(cache.root.parent / "layers"))
            if doubt is None:
                reporter.line(f"✓ {tag} exists and is what this lock's build makes; not rebuilt")
                return tag
            reporter.line(f"{tag} is not trusted: {doubt}; rebuilding")
    log_dir = request.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{resolved.id}.log"
    new_log = log_dir / f"{resolved.id}.log.new"
    failed_log = log_dir / f"{resolved.id}.failed.log"
    try:
        with reporter.step(f"build {tag}"), new_log.open("w", encoding="utf-8") as log:
            reporter.detail(
                f"layers: {plan.describe()}; base image {base_ref} ({base.id}); log {log_path}"
            )
            check_python(client, base, resolved.python, log=log)
            options: dict[str, Any] = dict(cache=cache, log=log, reporter=reporter, keep_stages=request.keep_stages)  # fmt: skip
            try:
                made = _make_image(client, tag, what, no_cache=no_cache, **options)
            except LayerGone as e:
                reporter.line(f"    {e}; making and sending every layer again")
                log.write(f"{e}; making and sending every layer again\n")
                made = _make_image(client, tag, what, no_cache=True, send_all=True, **options)
            log.write(f"image {made} tagged {tag}\n")
    except BaseException as e:
        new_log.replace(failed_log)
        if isinstance(e, BuildFailed):
            raise BuildFailed(f"{e} (full log: {failed_log})") from e
        raise
    new_log.replace(log_path)
    failed_log.unlink(missing_ok=True)
    return tag


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What one image is made from."""

    resolved: ResolvedCombination
    plan: LayerPlan
    suite: tuple[LockedWheel, ...]  # the suite lock's wheels that the lock does not hold
    suite_sha256: str  # "" without a suite lock
    base: BaseImage
    lock_sha256: str
    recipe: str
    inputs: str
    library_path: str
    revision: str | None = None  # `Settings.revision`; None: ask git

    def wheels_of(self, layer: str) -> tuple[LockedWheel, ...]:
        """The wheels a layer installs (none for ``compiler`` and ``venv``)."""
        if layer == SUITE_GROUP:
            return self.suite
        if layer in GROUPS:
            return self.plan.groups[layer]
        return ()

    def requirements(self, layer: str) -> str:
        """What a layer is made from, as its layer key takes it."""
        if layer == "compiler":
            return " ".join(COMPILER_PACKAGES)
        if layer == "venv":
            return ""
        return install_requirements(self.wheels_of(layer))


def _suite_wheels(
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


def inspect_base(client: DockerClient, ref: str) -> BaseImage:
    """The base image's id, layers, config and history, from the daemon."""
    with _quick(client):
        return BaseImage.from_inspect(ref, client.api.inspect_image(ref), client.api.history(ref))


#: Every layer envbuilder adds, bottom to top: the compiler (shared by every image of a
#: base), the venv and user, the plan's groups, the suite's dependencies.
LAYERS: tuple[str, ...] = ("compiler", "venv", *GROUPS, SUITE_GROUP)


def check_python(client: DockerClient, base: BaseImage, python: str, *, log: IO[str]) -> None:
    """Refuse a base image whose ``python3`` is not ``python``, before any wheel is fetched."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    status, output = run_container(client, base.id, ["python3", "-c", code], log=log)
    found = output.strip().splitlines()[-1] if output.strip() else ""
    if status != 0:
        raise BuildFailed(
            f"the base image {base.ref!r} cannot run python3 ({output.strip()[-300:] or f'exit {status}'}); "
            f"choose a base with Python {python} (--base-image or base-image in matrix.toml)"
        )
    if found != python:
        raise InputError(
            f"the base image {base.ref!r} has Python {found}, the lock is for Python {python}; "
            "choose a base with that Python (--base-image or base-image in matrix.toml)"
        )


#: Labels of the containers a build runs: which process made it (`owner_token`), and
#: what for. A later build removes those whose process is gone (`sweep_leftovers`).
OWNER_LABEL = f"{LABEL_PREFIX}.build.owner"
ROLE_LABEL = f"{LABEL_PREFIX}.build.role"
_RUN_LABEL = f"{LABEL_PREFIX}.build.run"  # one container of the build
#: The file in a stage directory that names the process that made it.
_STAGE_OWNER = "owner"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), "" where unknown: with the
    pid it names one process, not a later one that got the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def owner_token(pid: int | None = None) -> str:
    """``<host>:<pid>:<start time>`` of this process (or ``pid``)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_gone(token: str) -> bool:
    """Whether the process ``token`` names has ended. A process of another host, or a
    token that cannot be read, is taken as alive: only this host can tell."""
    parts = token.split(":")
    if len(parts) != 3:
        return False
    host, pid_text, start = parts
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now == "" or (start != "" and now != start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def run_container(
    client: DockerClient,
    image: str,
    command: list[str],
    *,
    log: IO[str],
    volumes: Mapping[str, Mapping[str, str]] | None = None,
    reporter: Reporter | None = None,
    network: str = "none",
    role: str = "check",
) -> tuple[int, str]:
    """Run ``command`` as root in a container of ``image`` (without network unless told);
    its exit status and output (also written to ``log``). The container is removed, also
    when the build is interrupted (SIGINT, SIGTERM); one removed from outside while it
    runs is a `BuildFailed` that says so, and a failed removal never hides the error that
    ended the run. What it writes into the read-write ``volumes`` is given to the user
    who runs envbuilder (their uid:gid), who can then remove it."""
    volumes = dict(volumes or {})
    writable = [v["bind"] for v in volumes.values() if v.get("mode") == "rw"]
    entrypoint, arguments = command[:1], command[1:]
    if writable:
        owner = f"{os.getuid()}:{os.getgid()}"
        script = f'"$@"; status=$?; chown -R {owner} {" ".join(writable)} || exit 125; exit $status'
        entrypoint, arguments = ["sh", "-c", script, "sh"], command
    run = uuid.uuid4().hex
    try:
        with _quick(client):
            container = client.containers.create(
                image,
                arguments,
                entrypoint=entrypoint,
                user="0:0",
                network_mode=network,
                volumes=volumes,
                labels={OWNER_LABEL: owner_token(), ROLE_LABEL: role, _RUN_LABEL: run},
            )
    except BaseException:  # interrupted while the daemon made it: find it by its label
        with _quick(client):
            for made in client.api.containers(all=True, filters={"label": f"{_RUN_LABEL}={run}"}):
                client.api.remove_container(made["Id"], force=True)
        raise
    lines: list[str] = []
    try:
        with _quick(client):
            container.start()
        for chunk in container.logs(stream=True, follow=True):
            text = chunk.decode("utf-8", "replace")
            log.write(text)
            lines.append(text)
            if reporter is not None:
                for line in text.splitlines():
                    if line.startswith(("install-group.sh:", "install-compiler.sh:")):
                        reporter.line(f"    {line.split(': ', 1)[-1]}")
                    elif line.strip():
                        reporter.detail(line)
        status = _wait(container)
    except BaseException:
        problem = _discard(container)
        if problem and problem != _GONE:
            log.write(f"{problem}\n")
        raise
    problem = _discard(container)
    if problem == _GONE:
        raise BuildFailed(_removed_outside(container, f"it exited {status}"))
    if problem:
        raise BuildFailed(problem)
    log.flush()
    return status, "".join(lines)


def _removed_outside(container: DockerContainer, detail: object) -> str:
    return (
        f"the container {container.short_id} was removed by someone else while it ran "
        f"(`docker rm`, a prune?); nothing is built from it ({detail})"
    )


def _wait(container: DockerContainer) -> int:
    from docker.errors import NotFound

    try:
        return int(container.wait()["StatusCode"])
    except NotFound as e:
        raise BuildFailed(_removed_outside(container, e.explanation or e)) from e


#: What `_discard` says of a container that someone else removed (or is removing).
_GONE = "gone"


def _discard(container: DockerContainer) -> str | None:
    """Remove ``container``: None when done, `_GONE` when someone else removed it or is
    removing it, else what went wrong. Never raises: the error that ended the run stays
    the one the user sees."""
    from docker.errors import APIError, NotFound

    try:
        container.remove(force=True)
    except NotFound:
        return _GONE
    except APIError as e:
        if e.status_code == 409 and "in progress" in str(e):
            return _GONE
        return f"could not remove the container {container.short_id}: {e}"
    return None


def remove_stage(client: DockerClient, stage: Path, *, image: str) -> None:
    """Remove the stage directory ``stage``. What a container killed before it could hand
    its files over left (root's files) is removed by root in a container of ``image``."""
    shutil.rmtree(stage, ignore_errors=True)
    if not stage.exists() or os.geteuid() == 0:
        return
    from docker.errors import DockerException

    try:
        client.containers.run(
            image,
            ["-c", "rm -rf /stage/* /stage/.[!.]* 2>/dev/null; true"],
            entrypoint=["sh"],
            user="0:0",
            network_mode="none",
            volumes={str(stage): {"bind": "/stage", "mode": "rw"}},
            labels={OWNER_LABEL: owner_token(), ROLE_LABEL: "cleanup"},
            remove=True,
        )
    except DockerException as e:
        logger.warning("cannot remove %s with a container: %s", stage, e)
    shutil.rmtree(stage, ignore_errors=True)


def sweep_leftovers(client: DockerClient, stages: Path, *, image: str, reporter: Reporter) -> None:
    """Remove what builds killed before they could clean up (SIGKILL, a lost machine) left:
    their containers (by `OWNER_LABEL`) and stage directories under ``stages``, where the
    process that made them is gone. Others' builds, running or not ours, are left alone."""
    with _quick(client):
        found = client.containers.list(all=True, filters={"label": OWNER_LABEL})
    for container in found:
        token = str((container.labels or {}).get(OWNER_LABEL, ""))
        if not owner_gone(token):
            continue
        problem = _discard(container)
        what = f"the container {container.short_id} of an ended build ({token})"
        if problem in (None, _GONE):
            reporter.detail(f"removed {what}")
        else:
            reporter.line(f"    {what} stays: {problem}")
    for stage in sorted(stages.glob("envbuilder-build-*")) if stages.is_dir() else ():
        try:
            token = (stage / _STAGE_OWNER).read_text(encoding="utf-8").strip()
        except OSError:
            continue  # not ours to judge (made before owners were recorded, or not a stage)
        if owner_gone(token):
            remove_stage(client, stage, image=image)
            if stage.exists():
                reporter.line(f"    the stage directory {stage} of an ended build stays; remove it")
            else:
                reporter.detail(f"removed the stage directory {stage} of an ended build ({token})")


def build_error(output: str) -> str:
    """What to say when the install failed: pip's errors (from its first ``ERROR:`` line,
    a hash mismatch included), else the last lines of the output."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("ERROR:")), None)
    shown = lines[first : first + 12] if first is not None else lines[-12:]
    return "\n  ".join(shown)


class LayerCache:
    """Layers made before, by key: diff id, size and the manifest entries of their venv files.

    A record says what a layer of those inputs is; the daemon holds its bytes.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> LayerRecord | None:
        try:
            data = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return LayerRecord(
            layer=Layer(diff_id=str(data["diff_id"]), size=int(data["size"])),
            entries=tuple((str(a), str(b), str(c)) for a, b, c in data["entries"]),
            facts={str(k): str(v) for k, v in (data.get("facts") or {}).items()},
        )

    def put(self, key: str, record: LayerRecord) -> None:
        document = {
            "diff_id": record.layer.diff_id,
            "size": record.layer.size,
            "entries": [list(e) for e in record.entries],
            "facts": dict(record.facts),
        }
        write_atomic(self.root / f"{key}.json", json.dumps(document))


@dataclass(frozen=True, kw_only=True)
class LayerRecord:
    layer: Layer
    entries: tuple[tuple[str, str, str], ...]
    #: what the layer says about itself (the compiler layer: cc, c++ and its packages)
    facts: Mapping[str, str] = field(default_factory=dict)


def layer_key(name: str, requirements: str, *, base_id: str, recipe: str) -> str:
    """What a layer's bytes depend on: its wheels, the base's Python (by base id), the recipe."""
    document = {"layer": name, "requirements": requirements, "base": base_id, "recipe": recipe}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _daemon_chains(client: DockerClient) -> set[str]:
    """The chain ids of every image's layers: the layer stacks the daemon holds."""
    from docker.errors import ImageNotFound

    chains: set[str] = set()
    with _quick(client):
        for listed in client.api.images(all=True, quiet=True):
            try:  # another build may remove an image between the list and this look
                attrs = client.api.inspect_image(listed)
            except ImageNotFound:
                continue
            chains.update(chain_ids((attrs.get("RootFS") or {}).get("Layers") or ()))
    return chains


def _layer_keys(inputs: Inputs) -> dict[str, str]:
    return {
        name: layer_key(
            name, inputs.requirements(name), base_id=inputs.base.id, recipe=inputs.recipe
        )
        for name in LAYERS
    }


def _labels(inputs: Inputs, records: Mapping[str, LayerRecord] | None) -> dict[str, str]:
    """The image's labels; without ``records``, those that the built layers do not decide
    (the manifest's and the compiler's are left out): what `inputs_digest` takes."""
    manifest = Manifest(sha256="", files=0)
    if records is not None:
        manifest = manifest_of(records[name].entries for name in LAYERS)
    labels = image_labels(
        inputs.resolved,
        lock_sha256=inputs.lock_sha256,
        manifest=manifest,
        base_image=inputs.base.ref,
        plan=inputs.plan,
        revision=source_revision(inputs.revision),
        recipe=inputs.recipe,
        compiler=records["compiler"].facts if records is not None else None,
        suite=inputs.suite,
        suite_sha256=inputs.suite_sha256,
    ) | base_labels(inputs.base)
    if records is None:
        return {k: v for k, v in labels.items() if not k.startswith(f"{LABEL_PREFIX}.manifest.")}
    return labels | {f"{LABEL_PREFIX}.inputs.sha256": inputs.inputs}


def _config(inputs: Inputs, records: Mapping[str, LayerRecord]) -> bytes:
    """The image config of ``inputs`` over these layers: what the build loads, byte for byte."""
    base = inputs.base
    settings = image_settings(_labels(inputs, records))
    return image_config(
        base,
        [(_describe(name, inputs), records[name].layer) for name in LAYERS],
        env=image_env(base.config.get("Env") or [], venv=VENV, library_path=inputs.library_path),
        labels=settings["labels"],
        user=settings["user"],
        workdir=settings["workdir"],
        cmd=settings["cmd"],
    )


def _doubt(client: DockerClient, found: str, inputs: Inputs, layers: LayerCache) -> str | None:
    """Why the image ``found`` is not the one these inputs' build makes; None when it is.

    Labels and tags can be written by anyone who can reach the daemon; the image id is the
    sha256 of the config, which lists every layer's digest, and the daemon checks each layer
    against it. So the image is trusted only when its id is the one the config made from the
    layer cache's records of these inputs has. Without such records nothing vouches for it.
    """
    keys = _layer_keys(inputs)
    records = {name: layers.get(keys[name]) for name in LAYERS}
    unknown = [name for name, record in records.items() if record is None]
    if unknown:
        return f"no build of these inputs is recorded here (layer(s) {', '.join(unknown)})"
    config = _config(inputs, {n: r for n, r in records.items() if r is not None})
    if image_id(config) == found:
        return None
    expected = json.loads(config)["rootfs"]["diff_ids"]
    actual = (client.api.inspect_image(found).get("RootFS") or {}).get("Layers") or []
    if list(actual) != list(expected):
        return (
            f"its layers ({len(actual)}) are not the {len(expected)} that this lock's build "
            f"makes (first difference at layer {_first_difference(actual, expected) + 1})"
        )
    return (
        "its layers are the build's but its config is not (another envbuilder revision, or edited)"
    )


def _first_difference(a: list[str], b: list[str]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _make_image(
    client: DockerClient,
    tag: str,
    inputs: Inputs,
    *,
    cache: WheelCache,
    log: IO[str],
    reporter: Reporter,
    no_cache: bool,
    keep_stages: bool,
    send_all: bool = False,
) -> str:
    base = inputs.base
    layers = LayerCache(cache.root.parent / "layers")
    keys = _layer_keys(inputs)
    present = _daemon_chains(client)
    records: dict[str, LayerRecord] = {}
    needed: list[str] = []
    diff_ids = list(base.diff_ids)
    for name in LAYERS:
        # A layer above one that is made again is made again too: the daemon
        # has its bytes only on top of the layers below it.
        record = None if no_cache or needed else layers.get(keys[name])
        if record is not None:
            diff_ids.append(record.layer.diff_id)
            if chain_ids(diff_ids)[-1] not in present:
                record = None
        if record is None:
            needed.append(name)
        else:
            records[name] = record
    cache.root.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(client, cache.root, image=base.id, reporter=reporter)
    work = Path(tempfile.mkdtemp(prefix="envbuilder-build-", dir=cache.root))
    (work / _STAGE_OWNER).write_text(owner_token() + "\n", encoding="utf-8")
    layer_files: dict[str, Path] = {}
    try:
        if needed:
            reporter.line(
                f"    make layer(s) {', '.join(needed)}; reuse {', '.join(records) or 'none'}"
            )
            (work / "out").mkdir()
            if "compiler" in needed:
                _install_compiler(client, base, work / "out", log=log, reporter=reporter)
            groups = [name for name in needed if name != "compiler"]
            wheels = [w for name in groups for w in inputs.wheels_of(name)]
            with reporter.step(f"fetch {len(wheels)} wheel(s) into {cache.root}"):
                for wheel in wheels:
                    cache.fetch(wheel)
            for name in groups:
                if name != "venv":
                    _link_group(cache, work / "wheels" / name, inputs.wheels_of(name))
            (work / "wheels").mkdir(exist_ok=True)
            status, output = run_container(
                client,
                base.id,
                ["sh", "/envbuilder/recipe/install-group.sh", "/envbuilder/out", *groups],
                volumes={
                    str(DOCKER_DIR): {"bind": "/envbuilder/recipe", "mode": "ro"},
                    str(work / "wheels"): {"bind": "/envbuilder/wheels", "mode": "ro"},
                    str(work / "out"): {"bind": "/envbuilder/out", "mode": "rw"},
                },
                log=log,
                reporter=reporter,
                role="install",
            )
            if status != 0:
                raise BuildFailed(
                    f"installing {inputs.resolved.id}'s wheels failed:\n  {build_error(output)}"
                )
            with reporter.step(f"write {len(needed)} layer(s)"):
                for name in needed:
                    stage = work / "out" / name
                    path = work / f"{name}.tar"
                    with path.open("wb") as f:
                        layer = write_layer(stage, f, owners=_OWNERS)
                    record = LayerRecord(
                        layer=layer,
                        entries=tuple(manifest_entries(stage / VENV.lstrip("/")))
                        + tuple(manifest_entries(stage / COMPILER_RECORD_DIR.lstrip("/"), prefix=COMPILER_RECORD_DIR)),
                        facts=_compiler_facts(stage) if name == "compiler" else {},
                    )  # fmt: skip
                    layers.put(keys[name], record)
                    records[name] = record
                    layer_files[layer.diff_id] = path
                    reporter.detail(f"{name}: {layer.diff_id} ({layer.size / 1e6:.1f} MB)")
                    if not keep_stages:
                        shutil.rmtree(stage)
        config = _config(inputs, records)
        reporter.detail(f"manifest sha256 {manifest_of(records[n].entries for n in LAYERS).sha256}")
        made = image_id(config)
        previous = _image_id(client, tag)
        if _image_id(client, made) is None:
            all_diffs = json.loads(config)["rootfs"]["diff_ids"]
            chains = chain_ids(all_diffs)
            present = set() if send_all else _daemon_chains(client)  # as late as can be
            missing = {
                d: layer_files[d]
                for d, c in zip(all_diffs, chains, strict=True)
                if c not in present and d in layer_files
            }
            with reporter.step(f"docker load {tag} ({len(missing)} new layer(s))"):
                load_image(client, archive_chunks(config, tag=tag, layer_files=missing))
        else:
            client.images.get(made).tag(*tag.rsplit(":", 1))
        if previous is not None and previous != made:
            _remove_if_unused(client, previous, reporter)
        if keep_stages:
            reporter.line(f"    stages kept in {work}")
        return made
    finally:
        if not keep_stages:
            remove_stage(client, work, image=base.id)


def _install_compiler(
    client: DockerClient, base: BaseImage, out: Path, *, log: IO[str], reporter: Reporter
) -> None:
    """``out/compiler``: the files apt installs for ``COMPILER_PACKAGES`` in a container of
    the base (the build's one step with network: the base's own Debian mirror)."""
    with reporter.step(f"install {', '.join(COMPILER_PACKAGES)} from the base's Debian packages"):
        status, output = run_container(
            client,
            base.id,
            ["sh", "/envbuilder/recipe/install-compiler.sh", "/envbuilder/out/compiler", *COMPILER_PACKAGES],
            volumes={
                str(DOCKER_DIR): {"bind": "/envbuilder/recipe", "mode": "ro"},
                str(out): {"bind": "/envbuilder/out", "mode": "rw"},
            },
            log=log,
            reporter=reporter,
            network=_COMPILER_NETWORK,
            role="compiler",
        )  # fmt: skip
    if status != 0:
        raise BuildFailed(
            f"installing the compiler ({' '.join(COMPILER_PACKAGES)}) into the base image "
            f"{base.ref!r} failed (it needs a Debian-based base whose apt reaches its mirror):\n"
            f"  {build_error(output)}"
        )


def _compiler_facts(stage: Path) -> dict[str, str]:
    """``cc``, ``cxx`` (their ``--version`` first lines) and ``packages`` from ``compiler.txt``."""
    record = stage / COMPILER_RECORD_DIR.lstrip("/") / "compiler.txt"
    facts: dict[str, str] = {}
    packages: list[str] = []
    for line in record.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(": ")
        if key in ("cc", "cxx"):
            facts[key] = value.strip()
        elif key == "package":
            packages.append(value.strip())
    facts["packages"] = " ".join(packages)
    return facts


#: Owners other than root:root in envbuilder's layers.
_OWNERS = {"home/envbuilder": (10001, 10001)}


def _describe(name: str, inputs: Inputs) -> str:
    if name == "compiler":
        return f"envbuilder: compiler, Debian packages {' '.join(COMPILER_PACKAGES)}"
    if name == "venv":
        return f"envbuilder: empty venv {VENV} and user envbuilder (10001)"
    return f"envbuilder: {name} layer, {len(inputs.wheels_of(name))} wheel(s)"


def load_image(client: DockerClient, chunks: Iterator[bytes]) -> None:
    """``docker load`` of an archive; raises BuildFailed with the daemon's error."""
    from docker.errors import APIError

    try:
        for item in client.api.load_image(chunks):
            if "error" in item:
                error = str(item["error"])
                if "layer.tar: no such file" in error:
                    raise LayerGone(
                        "a layer that the daemon held when the build began is gone "
                        f"(another image was removed): {error}"
                    )
                raise BuildFailed(f"docker load failed: {error}")
    except APIError as e:
        if "layer.tar: no such file" in str(e):
            raise LayerGone(
                "a layer that the daemon held when the build began is gone "
                f"(another image was removed): {e}"
            ) from e
        raise BuildFailed(f"docker load failed: {e}") from e


def _image_id(client: DockerClient, ref: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        with _quick(client):
            return str(client.images.get(ref).id)
    except ImageNotFound:
        return None


def _remove_if_unused(client: DockerClient, image_id: str, reporter: Reporter) -> None:
    """Remove the image a build replaced when nothing names or runs it any more."""
    from docker.errors import APIError

    image = client.images.get(image_id)
    if image.tags or client.containers.list(all=True, filters={"ancestor": image_id}):
        return
    try:
        client.images.remove(image_id)
    except APIError as e:
        reporter.detail(f"the replaced image {image_id} stays: {e}")
        return
    reporter.detail(f"removed the replaced image {image_id}")


def link_wheels(
    plan: LayerPlan, cache: WheelCache, root: Path, *, groups: Iterable[str] = GROUPS
) -> None:
    """``root/<group>/``: hard links of the group's cached wheels and its requirements.txt."""
    for group in groups:
        _link_group(cache, root / group, plan.groups[group])  # type: ignore[index]


def _link_group(cache: WheelCache, directory: Path, wheels: Iterable[LockedWheel]) -> None:
    directory.mkdir(parents=True)
    wheels = tuple(wheels)
    for wheel in wheels:
        cache.link_into(wheel, directory)
    (directory / "requirements.txt").write_text(install_requirements(wheels), encoding="utf-8")


def recipe_digest() -> str:
    """sha256 of the recipe: the in-container installer and the code that writes layers and
    config. An image with the lock's tag is up to date only when the same recipe made it."""
    digest = hashlib.sha256()
    scripts = ("install-group.sh", "install-compiler.sh")
    for path in (*(DOCKER_DIR / n for n in scripts), Path(__file__).with_name("layers.py")):
        digest.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    return digest.hexdigest()


def _image_exists(client: DockerClient, ref: str) -> bool:
    return _image_id(client, ref) is not None


def _ensure_base(client: DockerClient, base: str, reporter: Reporter) -> None:
    if _image_exists(client, base):
        return
    from docker.errors import DockerException

    reporter.line(f"+ docker pull {base}")
    try:
        client.images.pull(base)
    except DockerException as e:
        raise MissingToolError(
            f"base image {base!r} is not on this machine and could not be pulled ({e}); "
            "pull or build it first (envbuilder/docker/recipe/make-base.sh makes a local Debian one), "
            "or choose another with base-image in matrix.toml / --base-image"
        ) from e


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


def push_image(
    client: DockerClient, tag: str, registry: str, *, reporter: Reporter | None = None
) -> str:
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
