"""Build one image per combination from its lock, without ``docker build``.

``ensure_image`` is the entry point: it returns ``envbuilder/<id>:<lock
sha256[:12]>``, building only when no image with that tag was made from the
same inputs: the lock, the base image (by id) and the recipe.

A build checks the base's Python first, then makes only the layers this
process does not hold: it fetches and verifies those wheels into the host's
wheel cache, mounts hard links of them read-only into one container of the
base image (network ``none``), where ``envbuilder/docker/recipe/install-group.sh`` installs each
group with pip (checking every hash again) and byte-compiles it, into the tree of
the layer right above the group's, while the next group installs. The host hashes each tree as a reproducible layer (``layers.py``)
as soon as it is final, while the others install, and ``docker load``s the
image config with the layers the daemon lacks, their tars made again from the
trees as they are sent (and checked against the hashes once more); no tar is
written to disk. Where the final layers below the ones still installing are big
(a CUDA lock's toolkit libraries, or torch while its bytecode is compiled), ``early_load``
loads them first, so that the daemon applies them while the rest installs. Nothing is sent as a build context, no build stage or
dangling image is left, and the same inputs give the same layers and image id
on any machine.

The trees stay on disk for the rest of the process (up to `KEPT_TREES_BYTES`,
in an ``envbuilder-kept-*`` directory it owns): a layer whose own inputs did not
change while one below it did (the suite above a changed ``rest``) is sent
again from its tree rather than installed again.

Two layers come from outside the combination's lock: right above the base,
``compiler`` (Debian's gcc, g++ and libc headers; ``base.py`` says why and how), and
on top, ``suite``: the conformance suite's own dependencies (diffusers and its
closure) from the suite lock beside the combination's lock, when there is one.

An existing image is never trusted by its tag, its labels or any record on
the host: the envbuilder cache and the daemon are writable by whoever runs
builds there, so a record that names a planted layer and an image that
matches it prove nothing. Every build makes its layers from the lock now,
hashes the bytes it wrote, and keeps an existing image only when its id (the
sha256 of its config, which lists every layer's digest) is the one those
bytes make; otherwise it is replaced. What is reused is only what the daemon
already holds (layers it checked against their digests when they were
loaded) and the layers this process made for an earlier combination.

The rest lives beside this module, which re-exports what other modules import from it:
``daemon`` (the client, images the daemon holds, the errors), ``base`` (the base's
Python and the compiler layer), ``containers`` (running and
sweeping the build's containers), ``identity`` (labels, digests, lock paths),
``image_inputs`` (what an image is made from, its layers' records, labels and config) and
``manifest`` (the venv's manifest).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envbuilder.docker.base import (
    COMPILER_PACKAGES,
    _install_compiler,
    check_python,
)
from envbuilder.docker.cache import WheelCache, _link_group, link_wheels
from envbuilder.docker.client import DockerClient
from envbuilder.docker.containers import (
    _KEPT_PREFIX,
    _STAGE_OWNER,
    OWNER_LABEL,
    _stop_containers,
    build_error,
    owner_token,
    remove_stage,
    run_container,
    sweep_leftovers,
)
from envbuilder.docker.daemon import (
    BuildFailed,
    LayerGone,
    _daemon_chains,
    _ensure_base,
    _image_id,
    _remove_if_unused,
    docker_client,
    inspect_base,
    load_image,
    push_image,
)
from envbuilder.docker.early_load import EarlyLoader
from envbuilder.docker.identity import (
    LABEL_PREFIX,
    SUITE_GROUP,
    base_image_for,
    base_labels,
    image_labels,
    image_settings,
    inputs_digest,
    layer_key,
    lock_path,
    recipe_digest,
    source_revision,
    suite_lock_path,
    suite_wheels,
)
from envbuilder.docker.image_inputs import (
    BYTECODE,
    LAYERS,
    OWNERS,
    Inputs,
    LayerRecord,
    group_of_layer,
    hash_tree,
    image_config_of,
    labels_of,
    layer_keys,
    trees_to_send,
)
from envbuilder.docker.layers import (
    BaseImage,
    archive_chunks,
    chain_ids,
    image_id,
    write_layer,
)
from envbuilder.docker.manifest import (
    DOCKER_DIR,
    Manifest,
    manifest_of,
    measure_manifest,
)
from envbuilder.docker.plan import (
    LayerPlan,
    LockedWheel,
    image_tag,
    library_path,
    load_lock,
    lock_digest,
    plan_layers,
    with_built_wheel,
)
from envbuilder.errors import InputError
from envbuilder.model import ResolvedCombination
from envbuilder.reporter import Reporter

__all__ = [
    "COMPILER_PACKAGES",
    "DOCKER_DIR",
    "LABEL_PREFIX",
    "LAYERS",
    "OWNER_LABEL",
    "SUITE_GROUP",
    "BuildFailed",
    "ImageMade",
    "ImageRequest",
    "LayerGone",
    "Manifest",
    "base_image_for",
    "base_labels",
    "build_error",
    "docker_client",
    "ensure_image",
    "image_labels",
    "inputs_digest",
    "layer_key",
    "link_wheels",
    "load_image",
    "lock_path",
    "make_image",
    "manifest_of",
    "measure_manifest",
    "owner_token",
    "push_image",
    "recipe_digest",
    "run_container",
    "source_revision",
    "suite_lock_path",
    "suite_wheels",
    "sweep_leftovers",
]


@dataclass(frozen=True, kw_only=True)
class ImageRequest:
    """What `ensure_image` makes: the image of one resolved combination, from its lock.

    Every build makes the layers from the lock (an existing image is kept only when
    it is byte for byte what they make); ``force`` is what every build does, kept for
    callers that ask for it. ``no_cache`` makes again even the lock's layers this process
    made for an earlier combination; either way every layer is the same bytes. (The
    base's compiler layer is made once per process and base, whatever ``no_cache`` says.) ``base_image``
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


@dataclass(frozen=True, kw_only=True)
class ImageMade:
    """The image a build made (or found to be byte for byte what it made): its tag, and
    the id to run it by (a tag can be moved by anyone who reaches the daemon)."""

    tag: str
    id: str


def ensure_image(
    request: ImageRequest,
    *,
    client: DockerClient | None = None,
    reporter: Reporter | None = None,
) -> str:
    """The tag of the combination's image, made from the request's lock (`make_image`)."""
    return make_image(request, client=client, reporter=reporter).tag


def make_image(
    request: ImageRequest,
    *,
    client: DockerClient | None = None,
    reporter: Reporter | None = None,
) -> ImageMade:
    """The combination's image, its layers made from the request's lock by this process;
    an image already under its tag is kept only when it is those very bytes."""
    resolved, lock_path = request.resolved, request.lock_path
    reporter = reporter or Reporter()
    lock_bytes, lock_sha256 = _read_lock(request)
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
    suite, suite_sha256 = suite_wheels(resolved, lock_path, plan)
    client = docker_client(client)
    base_ref = request.base_image or f"python:{resolved.python}-slim"
    _ensure_base(client, base_ref, reporter)
    base = inspect_base(client, base_ref)
    # What a killed build left (its install container, a stage of a gigabyte), first.
    request.cache.root.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(client, request.cache.root, image=base.id, reporter=reporter)
    what = _inputs(
        request, plan, suite=suite, suite_sha256=suite_sha256, base=base, lock_sha256=lock_sha256
    )
    found = _image_id(client, tag)
    made = _make_logged(client, tag, what, request, found=found, reporter=reporter)
    return ImageMade(tag=tag, id=made)


def _read_lock(request: ImageRequest) -> tuple[bytes, str]:
    """The bytes of the request's lock and their sha256, refused unless the combination is
    resolved and the lock is the one its resolution records."""
    resolved, lock_path = request.resolved, request.lock_path
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
    return lock_bytes, lock_sha256


def _inputs(
    request: ImageRequest,
    plan: LayerPlan,
    *,
    suite: tuple[LockedWheel, ...],
    suite_sha256: str,
    base: BaseImage,
    lock_sha256: str,
) -> Inputs:
    """What the image is made from, with the digest of them all (`inputs_digest`)."""
    resolved = request.resolved
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
    return dataclasses.replace(
        what,
        inputs=inputs_digest(
            lock_sha256=lock_sha256,
            base_id=base.id,
            recipe=recipe,
            library_path=library,
            settings=image_settings(labels_of(what, None)),
            suite_sha256=suite_sha256,
        ),
    )


def _make_logged(
    client: DockerClient,
    tag: str,
    what: Inputs,
    request: ImageRequest,
    *,
    found: str | None,
    reporter: Reporter,
) -> str:
    """`_make_image`, its log in ``log_dir/<id>.log`` (``<id>.failed.log`` when it fails);
    every layer is made and sent again when one the daemon held went away meanwhile.
    ``found``: the id of the image under ``tag`` before the build, said to be kept or replaced."""
    resolved = request.resolved
    log_dir = request.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{resolved.id}.log"
    new_log = log_dir / f"{resolved.id}.log.new"
    failed_log = log_dir / f"{resolved.id}.failed.log"
    try:
        with reporter.step(f"build {tag}"), new_log.open("w", encoding="utf-8") as log:
            reporter.detail(
                f"layers: {what.plan.describe()}; base image {what.base.ref} ({what.base.id});"
                f" log {log_path}"
            )
            check_python(client, what.base, resolved.python, log=log)
            options: dict[str, Any] = dict(cache=request.cache, log=log, reporter=reporter, keep_stages=request.keep_stages)  # fmt: skip
            try:
                made = _make_image(client, tag, what, no_cache=request.no_cache, **options)
            except LayerGone as e:
                reporter.line(f"    {e}; making and sending every layer again")
                log.write(f"{e}; making and sending every layer again\n")
                made = _make_image(client, tag, what, no_cache=True, send_all=True, **options)
            log.write(f"image {made} tagged {tag}\n")
            if found == made:
                reporter.line(f"✓ {tag} existed and is what this build made (the same image id)")
            elif found is not None:
                reporter.line(
                    f"{tag} was {found}, not what this lock's build makes; replaced by {made}"
                )
    except BaseException as e:
        new_log.replace(failed_log)
        if isinstance(e, BuildFailed):
            raise BuildFailed(f"{e} (full log: {failed_log})") from e
        raise
    new_log.replace(log_path)
    failed_log.unlink(missing_ok=True)
    return made


#: The layers this process made, by `layer_key`: a build of another combination of the same
#: base reuses them while the daemon holds them. Never written to disk, where a record could
#: be rewritten between processes to name a planted layer.
_MADE_HERE: dict[str, LayerRecord] = {}


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
    """Make the layers no one holds, load the image under ``tag`` and return its id."""
    keys = layer_keys(inputs)
    records, needed = _reusable_layers(client, inputs, keys, no_cache=no_cache, send_all=send_all)
    cache.root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="envbuilder-build-", dir=cache.root))
    (work / _STAGE_OWNER).write_text(owner_token() + "\n", encoding="utf-8")
    early: EarlyLoader | None = None
    try:
        if needed:
            reporter.line(
                f"    make layer(s) {', '.join(needed)}; reuse {', '.join(records) or 'none'}"
            )
            early = EarlyLoader(client, inputs, records, reporter=reporter, log=log)
            made = _make_layers(client, inputs, needed, work, cache=cache, log=log, reporter=reporter, early=early)  # fmt: skip
            for name in needed:
                record = made[name]
                if not keep_stages:
                    record = _keep_tree(record, cache.root)
                _MADE_HERE[keys[name]] = record
                records[name] = record
                reporter.detail(f"{name}: {record.layer.diff_id} ({record.layer.size / 1e6:.1f} MB)")  # fmt: skip
            if keep_stages:
                for name in needed:
                    with (work / f"{name}.tar").open("wb") as f:
                        write_layer(made[name].tree or work, f, owners=OWNERS)
        config = image_config_of(inputs, records)
        reporter.detail(f"manifest sha256 {manifest_of(records[n].entries for n in LAYERS).sha256}")
        made_id = image_id(config)
        previous = _image_id(client, tag)
        if _image_id(client, made_id) is None:
            _load(client, tag, config, records, send_all=send_all, reporter=reporter)
        else:
            client.images.get(made_id).tag(*tag.rsplit(":", 1))
        if previous is not None and previous != made_id:
            _remove_if_unused(client, previous, reporter)
        if keep_stages:
            reporter.line(f"    stages kept in {work}")
        return made_id
    finally:
        if early is not None:
            early.remove()
        if not keep_stages:
            remove_stage(client, work, image=inputs.base.id)


def _reusable_layers(
    client: DockerClient,
    inputs: Inputs,
    keys: Mapping[str, str],
    *,
    no_cache: bool,
    send_all: bool,
) -> tuple[dict[str, LayerRecord], list[str]]:
    """The layers this process made that the image can reuse (by name), and the names of
    those it must make: a layer is reused while this process keeps its tree, or while the
    daemon holds its bytes on the very layers below it. A group and its bytecode are made
    together (the bytecode is compiled where the group is installed)."""
    present = _daemon_chains(client)
    records: dict[str, LayerRecord] = {}
    needed: list[str] = []
    diff_ids = list(inputs.base.diff_ids)
    for name in LAYERS:
        group = group_of_layer(name)  # a group's bytecode is made by installing the group
        # ``no_cache`` makes the lock's layers again; the compiler is the base's, not the lock's
        fresh = send_all or (no_cache and name != "compiler") or group in needed
        record = None if fresh else _MADE_HERE.get(keys[name])
        if record is not None and record.tree is not None and not record.tree.is_dir():
            record = dataclasses.replace(record, tree=None)
        if (
            record is not None
            and record.tree is None
            and (
                needed  # the daemon has its bytes only on top of the layers below it
                or chain_ids([*diff_ids, record.layer.diff_id])[-1] not in present
            )
        ):
            record = None  # neither this process nor the daemon holds its bytes
        if record is None:
            if group != name and records.pop(group, None) is not None:
                needed.append(group)
            needed.append(name)
        else:
            records[name] = record
            diff_ids.append(record.layer.diff_id)
    return records, needed


def _load(
    client: DockerClient,
    tag: str,
    config: bytes,
    records: Mapping[str, LayerRecord],
    *,
    send_all: bool,
    reporter: Reporter,
) -> None:
    """``docker load`` the image ``config`` as ``tag``, with the layers the daemon lacks
    (every layer with ``send_all``), each made again from its tree as it is sent."""
    all_diffs = json.loads(config)["rootfs"]["diff_ids"]
    present = set() if send_all else _daemon_chains(client)  # as late as can be
    missing = trees_to_send(all_diffs, records.values(), present)
    with reporter.step(f"docker load {tag} ({len(missing)} new layer(s))"):
        load_image(client, archive_chunks(config, tag=tag, layer_trees=missing))


def _make_layers(
    client: DockerClient,
    inputs: Inputs,
    needed: list[str],
    work: Path,
    *,
    cache: WheelCache,
    log: IO[str],
    reporter: Reporter,
    early: EarlyLoader | None = None,
) -> dict[str, LayerRecord]:
    """Install the ``needed`` layers' trees under ``work/out`` and hash each as a layer.

    The compiler's container (network: apt) runs beside the wheels' (no network), and
    each tree is hashed as soon as its container says it is final, while the others
    still install; nothing is written but the trees. ``early`` is told each layer as it
    is hashed (and loads the final ones below while the rest install); it is done with
    the trees when this returns.
    """
    out = work / "out"
    out.mkdir()
    hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuilder-hash")
    others = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuilder-compiler")
    hashed: dict[str, Future[LayerRecord]] = {}
    lock = threading.Lock()

    def hash_and_tell(name: str) -> LayerRecord:
        record = hash_tree(name, out / name)
        if early is not None:
            early.layer_done(name, record)
        return record

    def final(name: str) -> None:
        with lock:
            if name in needed and name not in hashed:
                hashed[name] = hashing.submit(hash_and_tell, name)

    def install_compiler() -> None:
        _install_compiler(client, inputs.base, out, log=log, reporter=reporter)
        final("compiler")

    try:
        compiler = others.submit(install_compiler) if "compiler" in needed else None
        trees = [name for name in needed if name != "compiler"]
        if trees:
            _install_groups(
                client, inputs, trees, work, cache=cache, log=log, reporter=reporter, final=final
            )
        if compiler is not None:
            compiler.result()
        with reporter.step(f"hash {len(needed)} layer(s)"):
            records = {name: hashed[name].result() for name in needed}
        if early is not None:
            early.finish()  # the trees move when this returns
        return records
    except BaseException:
        _stop_containers(client, role="compiler")  # apt need not finish for nothing
        if early is not None:
            early.abort()
        raise
    finally:
        others.shutdown(wait=True)
        hashing.shutdown(wait=True, cancel_futures=True)


def _install_groups(
    client: DockerClient,
    inputs: Inputs,
    trees: list[str],
    work: Path,
    *,
    cache: WheelCache,
    log: IO[str],
    reporter: Reporter,
    final: Callable[[str], None],
) -> None:
    """Make the layer ``trees`` under ``work/out``: install the wheels of each group among
    them, and compile each group's bytecode into its ``<group>-bytecode`` tree, in one
    container of the base (no network) that mounts only those trees; ``final(name)`` as
    each tree is."""
    out = work / "out"
    groups = [name for name in trees if not name.endswith(BYTECODE)]
    wheels = [w for name in groups for w in inputs.wheels_of(name)]
    with reporter.step(f"fetch {len(wheels)} wheel(s) into {cache.root}"):
        for wheel in wheels:
            cache.fetch(wheel)
    for name in groups:
        if name != "venv":
            _link_group(cache, work / "wheels" / name, inputs.wheels_of(name))
    (work / "wheels").mkdir(exist_ok=True)
    # each group's tree is its own mount: the compiler's container writes beside
    # them, and neither container's hand-over (chown) may walk the other's tree
    for name in trees:
        (out / name).mkdir()

    def on_line(line: str) -> None:
        group, _, done = line.removeprefix("install-group.sh: ").rpartition(" ")
        if line.startswith("install-group.sh: ") and done == "done":
            final(group)

    with reporter.step(f"install {', '.join(groups)} and compile their bytecode"):
        status, output = run_container(
            client,
            inputs.base.id,
            ["sh", "/envbuilder/recipe/install-group.sh", "/envbuilder/out", *groups],
            volumes={
                str(DOCKER_DIR): {"bind": "/envbuilder/recipe", "mode": "ro"},
                str(work / "wheels"): {"bind": "/envbuilder/wheels", "mode": "ro"},
                **{
                    str(out / name): {"bind": f"/envbuilder/out/{name}", "mode": "rw"}
                    for name in trees
                },
            },
            log=log,
            reporter=reporter,
            role="install",
            environment={"ENVBUILDER_OWNER": f"{os.getuid()}:{os.getgid()}"},
            on_line=on_line,
        )
    if status != 0:
        raise BuildFailed(
            f"installing {inputs.resolved.id}'s wheels failed:\n  {build_error(output)}"
        )
    for name in trees:
        final(name)  # a line lost: hash it now


#: At most this many bytes of layer trees stay on disk for the rest of the process (oldest
#: go first): a layer above a changed one is sent again from its tree, not installed again.
KEPT_TREES_BYTES = 8_000_000_000
_KEPT: dict[str, Path] = {}  # layer diff id -> its tree, oldest first


_KEPT_ROOTS: dict[Path, Path] = {}


def _kept_root(cache_root: Path) -> Path:
    """This process's directory of kept layer trees under ``cache_root`` (swept like a stage
    when the process is gone, removed when it exits)."""
    root = _KEPT_ROOTS.get(cache_root)
    if root is None or not root.is_dir():
        root = Path(tempfile.mkdtemp(prefix=_KEPT_PREFIX, dir=cache_root))
        (root / _STAGE_OWNER).write_text(owner_token() + "\n", encoding="utf-8")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _KEPT_ROOTS[cache_root] = root
    return root


def _keep_tree(record: LayerRecord, cache_root: Path) -> LayerRecord:
    """``record`` with its tree moved where it stays for this process, within `KEPT_TREES_BYTES`;
    without a tree when it does not fit."""
    tree = record.tree
    if tree is None:
        return record
    if record.layer.size > KEPT_TREES_BYTES:
        return dataclasses.replace(record, tree=None)
    kept = _kept_root(cache_root) / record.layer.diff_id.removeprefix("sha256:")
    if record.layer.diff_id in _KEPT:  # the same bytes, made again: keep the fresh tree
        _forget_tree(record.layer.diff_id)
    sizes = {r.layer.diff_id: r.layer.size for r in _MADE_HERE.values()}
    while _KEPT and sum(sizes.get(d, 0) for d in _KEPT) + record.layer.size > KEPT_TREES_BYTES:
        _forget_tree(next(iter(_KEPT)))
    tree.rename(kept)
    _KEPT[record.layer.diff_id] = kept
    return dataclasses.replace(record, tree=kept)


def _forget_tree(diff_id: str) -> None:
    path = _KEPT.pop(diff_id)
    # a torch tree is tens of thousands of files: removed beside the build, not in its way
    gone = path.with_name(f".removed-{uuid.uuid4().hex}")
    try:
        path.rename(gone)
    except OSError:
        gone = path
    threading.Thread(target=shutil.rmtree, args=(gone,), kwargs={"ignore_errors": True}, daemon=True).start()  # fmt: skip
    for key, record in list(_MADE_HERE.items()):
        if record.layer.diff_id == diff_id:
            _MADE_HERE[key] = dataclasses.replace(record, tree=None)
