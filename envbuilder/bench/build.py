"""Benchmark of ``envbuilder build``: ``nox -s bench -- build [--synthetic]``.

Builds combinations with envbuilder's layers and naively
(``envbuilder/docker/recipe/Dockerfile.naive``: the same content, the compiler from the
base's Debian packages, the lock and the suite's wheels, made by one ``docker build``
without cache), interleaved, ``--repeat`` times each from cold (images removed, the
lock's layers made again), and prints medians and spreads, with the load average, of:

- the cold build, layered against naive (target: layered ≤ 0.5 × naive, issue 37). The
  compiler layer is made once per base image in the process (the first build, measured
  apart) and reused; the naive build runs apt every time, as one ``docker build`` does;
- a change of the ``rest`` group only (a small wheel added to the lock): the layer
  above it is sent again from its tree, not installed again (target ≤ 10 s);
- a ``--force`` rebuild with nothing changed (target ≤ 5 s);
- the image id of every cold build (target: one id per lock);
- a container's start to ``import torch`` (and ``xformers.ops`` when locked)
  (target ≤ 2.0 s, issue 27; on a quiet host), beside the naive image's (no bytecode), and the bytes the
  bytecode adds;
- with three combinations that share a runtime, the disk their layers take
  above the base, each distinct layer once (target: layered ≤ 60% of naive).

It exits 1 when a target is missed. Real mode takes three resolved CUDA
combinations from ``--locks`` whose locks pin the same CUDA runtime wheels
(multi-GB downloads), or the ones named by ``--combination``. ``--synthetic``
generates three locks of real wheels instead: a shared 200 MB runtime group,
a 100 MB torch-like wheel each and small rest.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import io
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import tomli_w

from envbuilder.docker.build import (
    DOCKER_DIR,
    SUITE_GROUP,
    BuildFailed,
    ImageRequest,
    docker_client,
    ensure_image,
    link_wheels,
    lock_path,
    source_revision,
    suite_lock_path,
    suite_wheels,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.client import DockerClient
from envbuilder.docker.layers import chain_ids
from envbuilder.docker.plan import (
    GROUPS,
    image_tag,
    install_requirements,
    load_lock,
    lock_digest,
    plan_layers,
)
from envbuilder.errors import EnvbuilderError, InputError
from envbuilder.files import atomic_writer, sha256_file
from envbuilder.model import Combination, ResolvedCombination, ResolvedTorch, load_resolution
from envbuilder.reporter import Reporter
from envbuilder.settings import Settings
from envbuilder.sourcebuild.image import image_wheel
from envbuilder.target import CudaTag

__all__ = ["main"]

MB = 1_000_000
TEST_BASE = "envbuilder-test/python:3.11"
DISK_TARGET = 0.60
REBUILD_TARGET_S = 5.0
IMPORT_TARGET_S = 2.0
COLD_RATIO_TARGET = 0.5
REST_ONLY_TARGET_S = 10.0
#: The label of envbuilder/docker/recipe/Dockerfile.naive's install stage.
NAIVE_STAGE_LABEL = "io.envbuilder.bench.naive-stage"


@dataclass(frozen=True, kw_only=True)
class Case:
    resolved: ResolvedCombination
    lock: Path


def main(argv: Sequence[str]) -> int:
    try:
        return _main(argv)
    except EnvbuilderError as e:
        print(f"bench build: error: {e}", file=sys.stderr)
        return e.return_code


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuilder.bench build", description=__doc__)
    parser.add_argument(
        "--synthetic", action="store_true", help="generate three locks of real wheels"
    )
    parser.add_argument(
        "--locks", type=Path, default=Path("locks"), help="real mode: resolve output"
    )
    parser.add_argument(
        "--combination",
        action="append",
        default=[],
        metavar="ID",
        help="real mode: measure these resolved combinations (repeatable)",
    )
    parser.add_argument("--base-image", default=None, help="base image (default: per mode)")
    parser.add_argument(
        "--python", default=None, help="real mode: only combinations for this Python (e.g. 3.11)"
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="cold builds per combination and kind"
    )
    parser.add_argument("--runtime-mb", type=int, default=200, help="synthetic runtime group size")
    parser.add_argument("--torch-mb", type=int, default=100, help="synthetic torch wheel size")
    parser.add_argument("--work", type=Path, default=None, help="synthetic wheels and locks")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
    if args.repeat < 2:
        raise InputError("--repeat must be at least 2: two cold builds show whether ids agree")
    reporter = Reporter(verbose=args.verbose)
    client = docker_client()
    settings = Settings.from_environment(os.environ)
    cache = WheelCache(settings.wheel_cache, client=settings.http_client())
    if args.synthetic:
        work = args.work or cache.root.parent / "bench-synthetic"
        cases = synthetic_cases(work, runtime_mb=args.runtime_mb, torch_mb=args.torch_mb)
        base = args.base_image or TEST_BASE
        mode = (
            f"synthetic (3 generated locks sharing a {args.runtime_mb} MB CUDA-runtime group, "
            f"{args.torch_mb} MB torch-like wheel each)"
        )
        if base == TEST_BASE:
            subprocess.run(["bash", str(DOCKER_DIR / "make-base.sh"), TEST_BASE], check=True)
    elif args.combination:
        cases = named_cases(args.locks, args.combination)
        base = args.base_image
        mode = f"real locks from {args.locks} ({', '.join(c.resolved.id for c in cases)})"
    else:
        cases = cases_sharing_a_runtime(args.locks, python=args.python)
        base = args.base_image
        mode = f"real locks from {args.locks} ({', '.join(c.resolved.id for c in cases)})"
    log_dir = cache.root.parent / "bench-logs"
    print(f"bench build: mode={mode}; base image {base or 'python:<python>-slim'}", flush=True)
    quiet = Reporter(io.StringIO())

    # one revision label for the whole run: commits meanwhile would change the image ids
    revision = source_revision(settings.revision)

    def request(case: Case, **kwargs: Any) -> ImageRequest:
        return ImageRequest(
            resolved=case.resolved, lock_path=case.lock, base_image=base, log_dir=log_dir,
            cache=cache, built_wheel=image_wheel(case.resolved, case.lock, cache),
            revision=revision, **kwargs,
        )  # fmt: skip

    def layered_build(case: Case, **kwargs: Any) -> str:
        return ensure_image(request(case, **kwargs), client=client, reporter=reporter)

    missed: list[str] = []
    layered: dict[str, str] = {}
    naive: dict[str, str] = {}
    for case in cases:
        cid = case.resolved.id
        # the base's compiler layer, made once in this process (apt beside the first install)
        _remove(client, image_tag(cid, lock_digest(case.lock.read_bytes())))
        start = time.monotonic()
        layered_build(case, force=True, no_cache=True)
        first = time.monotonic() - start
        cold_layered: list[float] = []
        cold_naive: list[float] = []
        rest_only: list[float] = []
        ids: list[str] = []
        loads: list[float] = []
        for i in range(args.repeat):
            loads.append(os.getloadavg()[0])
            _remove(client, image_tag(cid, lock_digest(case.lock.read_bytes())))
            start = time.monotonic()
            layered[cid] = layered_build(case, force=True, no_cache=True)
            cold_layered.append(time.monotonic() - start)
            ids.append(str(client.images.get(layered[cid]).id))
            changed = rest_changed(case, work=log_dir.parent / "bench-rest-only", version=f"1.{i}")
            start = time.monotonic()
            changed_tag = layered_build(changed)
            rest_only.append(time.monotonic() - start)
            _remove(client, changed_tag)
            loads.append(os.getloadavg()[0])
            _remove(client, naive_tag(case))
            start = time.monotonic()
            naive[cid] = naive_image(client, case, base, cache, log_dir, reporter)
            cold_naive.append(time.monotonic() - start)
        print(
            f"  {cid}: cold layered {_spread(cold_layered)}, naive {_spread(cold_naive)}, "
            f"rest-only change {_spread(rest_only)}",
            flush=True,
        )
        force: list[float] = []
        for _ in range(args.repeat):
            start = time.monotonic()
            ensure_image(request(case, force=True), client=client, reporter=quiet)
            force.append(time.monotonic() - start)
        # the synthetic xformers is one module; the real one's attention lives in xformers.ops
        xformers = "xformers" if args.synthetic else "xformers.ops"
        modules = ["torch"] + ([xformers] if "xformers" in _locked(case) else [])
        start_layered = [start_to_import(client, layered[cid], modules) for _ in range(args.repeat)]
        start_naive = [start_to_import(client, naive[cid], modules) for _ in range(args.repeat)]
        pyc = bytecode_bytes(client, layered[cid])
        layered_median, naive_median = (
            statistics.median(cold_layered),
            statistics.median(cold_naive),
        )
        ratios = [a / b for a, b in zip(cold_layered, cold_naive, strict=True)]
        checks = [
            (
                f"cold layered ≤ {COLD_RATIO_TARGET} × naive",
                layered_median <= COLD_RATIO_TARGET * naive_median,
            ),
            (
                f"rest-only change ≤ {REST_ONLY_TARGET_S:.0f} s",
                statistics.median(rest_only) <= REST_ONLY_TARGET_S,
            ),
            (f"--force no-change ≤ {REBUILD_TARGET_S:.0f} s", max(force) <= REBUILD_TARGET_S),
            ("one image id from every --no-cache build", len(set(ids)) == 1),
            (
                f"start to import ≤ {IMPORT_TARGET_S} s",
                statistics.median(start_layered) <= IMPORT_TARGET_S,
            ),
        ]
        print(
            f"{cid}:\n"
            f"  first build of the base (compiler layer made) {first:.2f} s\n"
            f"  cold build      layered {_spread(cold_layered)}, naive {_spread(cold_naive)} "
            f"(ratio {layered_median / naive_median:.2f}; per pair "
            f"{', '.join(f'{r:.2f}' for r in ratios)})\n"
            f"  rest-only change {_spread(rest_only)}\n"
            f"  --force no-change rebuild {_spread(force)}\n"
            f"  --no-cache image ids {', '.join(i.removeprefix('sha256:')[:19] for i in ids)}\n"
            f"  start to `import {', '.join(modules)}`: layered {_spread(start_layered)}, "
            f"naive {_spread(start_naive)}; bytecode adds {pyc / MB:.1f} MB to the image\n"
            f"  load average (1 min) during the builds: {_spread(loads, unit='')}\n"
            + "".join(f"  {'✓' if ok else '✕'} {what}\n" for what, ok in checks),
            flush=True,
        )
        missed += [f"{cid}: {what}" for what, ok in checks if not ok]

    base_ref = base or f"python:{cases[0].resolved.python}-slim"
    layered_bytes, layered_layers = unique_layers(client, list(layered.values()), base_ref)
    naive_bytes, naive_layers = unique_layers(client, list(naive.values()), base_ref)
    ratio = layered_bytes / naive_bytes
    shared = len(cases) >= 3 and not args.combination
    print(
        f"disk above the base, each distinct layer once:\n"
        f"  layered {layered_bytes / MB:9.1f} MB in {layered_layers} layers\n"
        f"  naive   {naive_bytes / MB:9.1f} MB in {naive_layers} layers\n"
        f"  ratio layered/naive = {ratio:.2f} "
        + (
            f"(target ≤ {DISK_TARGET:.2f}) {'✓' if ratio <= DISK_TARGET else '✕'}"
            if shared
            else "(no target: needs three combinations that share a runtime)"
        ),
        flush=True,
    )
    if shared and ratio > DISK_TARGET:
        missed.append(f"disk ratio {ratio:.2f} > {DISK_TARGET:.2f}")
    if missed:
        print(f"bench build: {len(missed)} target(s) missed: {'; '.join(missed)}", flush=True)
        return 1
    return 0


def _spread(times: Sequence[float], *, unit: str = " s") -> str:
    return f"median {statistics.median(times):.2f}{unit} ({min(times):.2f}–{max(times):.2f}, n={len(times)})"


def rest_changed(case: Case, *, work: Path, version: str) -> Case:
    """``case`` with one small wheel added to its lock: only the ``rest`` group changes
    (the suite lock, copied beside it, stays the same)."""
    marker = _wheel(work / "wheels", "envbuilder-bench-marker", version, 1024, seed=99)
    document = tomllib.loads(case.lock.read_text(encoding="utf-8"))
    document["packages"] = [
        *document["packages"],
        {
            "name": "envbuilder-bench-marker",
            "version": version,
            "wheels": [
                {
                    "url": marker.as_uri(),
                    "size": marker.stat().st_size,
                    "hashes": {"sha256": sha256_file(marker)},
                }
            ],
        },
    ]
    lock = work / version / case.lock.name
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(tomli_w.dumps(document), encoding="utf-8")
    suite = suite_lock_path(case.resolved, case.lock)
    if suite is not None:
        shutil.copyfile(suite, lock.parent / suite.name)
    resolved = dataclasses.replace(
        case.resolved, lock=str(lock), lock_sha256=lock_digest(lock.read_bytes())
    )
    return Case(resolved=resolved, lock=lock)


def _locked(case: Case) -> set[str]:
    return {w.name for w in load_lock(case.lock.read_bytes(), source=case.lock)}


def _remove(client: DockerClient, tag: str) -> None:
    from docker.errors import ImageNotFound

    with contextlib.suppress(ImageNotFound):
        client.images.remove(tag)


def start_to_import(client: DockerClient, tag: str, modules: Sequence[str]) -> float:
    """Seconds from creating a container of ``tag`` to its exit after importing ``modules``."""
    start = time.monotonic()
    client.containers.run(
        tag,
        ["/opt/venv/bin/python", "-c", f"import {', '.join(modules)}"],
        network_mode="none",
        remove=True,
    )
    return time.monotonic() - start


def bytecode_bytes(client: DockerClient, tag: str) -> int:
    """Bytes of the ``.pyc`` files in the image's venv."""
    code = (
        "import os; print(sum(os.path.getsize(os.path.join(d, f)) "
        "for d, _, fs in os.walk('/opt/venv') for f in fs if f.endswith('.pyc')))"
    )
    out = client.containers.run(tag, ["python", "-c", code], network_mode="none", remove=True)
    return int(out)


def unique_layers(client: DockerClient, tags: Sequence[str], base: str) -> tuple[int, int]:
    """Bytes and count of the distinct layers of ``tags`` above ``base``.

    A layer is named by its chain id (it and every layer below it); its size
    comes from the image's history, whose entries of size 0 that record no
    layer (``#(nop)`` steps, empty entries) are left out.
    """
    base_chains = set(chain_ids(client.images.get(base).attrs["RootFS"]["Layers"]))
    sizes: dict[str, int] = {}
    for tag in tags:
        diff_ids = client.images.get(tag).attrs["RootFS"]["Layers"]
        history = [
            int(entry["Size"])
            for entry in reversed(client.api.history(tag))
            if int(entry["Size"]) or "#(nop)" not in str(entry.get("CreatedBy"))
        ]
        # the top entries are this image's own layers; the base's are not counted anyway
        history = ([0] * len(diff_ids) + history)[-len(diff_ids) :]
        for chain, size in zip(chain_ids(diff_ids), history, strict=True):
            if chain not in base_chains:
                sizes[chain] = size
    layers = sum(1 for size in sizes.values() if size > 0)
    return sum(sizes.values()), layers


def naive_tag(case: Case) -> str:
    lock_bytes = case.lock.read_bytes()
    return (
        "envbuilder-bench/naive-"
        + image_tag(case.resolved.id, lock_digest(lock_bytes)).split("/", 1)[1]
    )


def naive_image(
    client: DockerClient,
    case: Case,
    base: str | None,
    cache: WheelCache,
    log_dir: Path,
    reporter: Reporter,
) -> str:
    """The same lock as one install layer (``envbuilder/docker/recipe/Dockerfile.naive``), built with
    ``docker build`` from a context of the lock's wheels."""
    from docker.errors import DockerException

    tag = naive_tag(case)
    plan = plan_layers(load_lock(case.lock.read_bytes(), source=case.lock))
    suite, _ = suite_wheels(case.resolved, case.lock, plan)
    for wheel in (*plan.wheels(), *suite):
        cache.fetch(wheel)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"naive-{case.resolved.id}.log"
    with (
        tempfile.TemporaryDirectory(prefix="envbuilder-naive-", dir=cache.root) as tmp,
        log_path.open("w", encoding="utf-8") as log,
    ):
        context = Path(tmp)
        link_wheels(plan, cache, context / "wheels")
        suite_dir = context / "wheels" / SUITE_GROUP
        suite_dir.mkdir()
        for wheel in suite:
            cache.link_into(wheel, suite_dir)
        (suite_dir / "requirements.txt").write_text(install_requirements(suite), encoding="utf-8")
        shutil.copyfile(DOCKER_DIR / "Dockerfile.naive", context / "Dockerfile")
        classic_build(
            client,
            path=str(context),
            tag=tag,
            nocache=True,
            buildargs={"BASE_IMAGE": base or f"python:{case.resolved.python}-slim"},
            log=log,
            log_path=log_path,
        )
    # the classic builder keeps the install stage as an untagged image (labelled in the Dockerfile)
    stages = {"dangling": True, "label": NAIVE_STAGE_LABEL}
    for stage in client.api.images(filters=stages, quiet=True):
        with contextlib.suppress(DockerException):
            client.images.remove(stage)
    return tag


def classic_build(client: DockerClient, *, log: IO[str], log_path: Path, **kwargs: Any) -> None:
    """One ``docker build`` (the daemon's classic builder), its output into ``log``."""
    from docker.errors import APIError

    try:
        # the host's network: apt reaches the base's mirror (pip gets --no-index)
        for item in client.api.build(
            rm=True, forcerm=True, pull=False, network_mode="host", decode=True, **kwargs
        ):
            if "stream" in item:
                log.write(str(item["stream"]))
            if "error" in item:
                raise BuildFailed(f"docker build failed: {item['error'].strip()} (log: {log_path})")
    except APIError as e:
        raise BuildFailed(f"docker build failed: {e} (log: {log_path})") from e


def named_cases(locks: Path, ids: Sequence[str]) -> list[Case]:
    """The resolved combinations ``ids`` of ``locks/resolution.json``."""
    resolved = load_resolution(locks / "resolution.json").by_id()
    cases: list[Case] = []
    for cid in ids:
        rc = resolved.get(cid)
        if rc is None or rc.status != "resolved":
            raise InputError(
                f"{locks / 'resolution.json'}: {cid!r} is not a resolved combination there"
            )
        cases.append(Case(resolved=rc, lock=lock_path(rc, locks)))
    return cases


def cases_sharing_a_runtime(locks: Path, *, python: str | None = None) -> list[Case]:
    """Three resolved CUDA combinations of one Python and one CUDA (so one base image) whose
    layers would share the most bytes. A layer is shared only where it and every layer below
    it hold the same wheels, so the pick weighs each layer's chain, by the locks' wheel sizes."""
    resolution = load_resolution(locks / "resolution.json")
    groups: dict[tuple[str, str], list[tuple[Case, dict[tuple[str, ...], int]]]] = {}
    for rc in resolution.combinations:
        if rc.status != "resolved" or rc.cuda == "cpu" or python not in (None, rc.python):
            continue
        lock = lock_path(rc, locks)
        plan = plan_layers(load_lock(lock.read_bytes(), source=lock))
        chains: dict[tuple[str, ...], int] = {}
        chain: tuple[str, ...] = ()
        for group in GROUPS:
            chain = (*chain, install_requirements(plan.groups[group]))
            chains[chain] = sum(w.size or 0 for w in plan.groups[group])
        groups.setdefault((rc.python, rc.cuda), []).append((Case(resolved=rc, lock=lock), chains))

    def saved(triple: tuple[tuple[Case, dict[tuple[str, ...], int]], ...]) -> int:
        unique: dict[tuple[str, ...], int] = {}
        for _, chains in triple:
            unique.update(chains)
        return sum(sum(chains.values()) for _, chains in triple) - sum(unique.values())

    triples = [t for members in groups.values() for t in itertools.combinations(members, 3)]
    if not triples:
        raise InputError(
            f"{locks}: no three resolved CUDA combinations of one Python and CUDA; "
            "resolve more (`nox -s resolve`) or use --synthetic"
        )
    return [case for case, _ in max(triples, key=saved)]


def synthetic_cases(work: Path, *, runtime_mb: int, torch_mb: int) -> list[Case]:
    """Three locks of generated wheels: shared runtime group, distinct torch, small rest."""
    wheels = work / "wheels"
    runtime = [
        _wheel(wheels, "nvidia-bench-cublas-cu12", "12.8.1", runtime_mb * 3 // 4 * MB, seed=1),
        _wheel(wheels, "nvidia-bench-runtime-cu12", "12.8.2", runtime_mb // 4 * MB, seed=2),
    ]
    common = _wheel(wheels, "bench-common", "1.0", 1 * MB, seed=3)
    cases: list[Case] = []
    for i, torch_version in enumerate(("9.0.0", "9.1.0", "9.2.0")):
        combination_id = f"bench-synthetic-torch{torch_version}"
        torch = _wheel(wheels, "torch", torch_version, torch_mb * MB, seed=10 + i)
        xformers = _wheel(wheels, "xformers", f"0.0.{90 + i}", 2 * MB, seed=20 + i)
        lock = work / "locks" / f"pylock.{combination_id}.toml"
        _write_lock(lock, [*runtime, torch, xformers, common])
        resolved = ResolvedCombination(
            combination=Combination(
                id=combination_id,
                python="3.11",
                cuda=CudaTag(12, 8),
                torch=torch_version,
                xformers=f"0.0.{90 + i}",
            ),
            status="resolved",
            reason="synthetic benchmark combination",
            torch=ResolvedTorch(
                version=torch_version,
                cuda=CudaTag(12, 8),
                cuda_source="requires-dist",
                filename=torch.name,
                url=torch.as_uri(),
                sha256=sha256_file(torch),
            ),
            lock=str(lock),
            lock_sha256=lock_digest(lock.read_bytes()),
        )
        cases.append(Case(resolved=resolved, lock=lock))
    return cases


def _write_lock(path: Path, wheels: Sequence[Path]) -> None:
    packages = []
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        packages.append(
            {
                "name": name.replace("_", "-"),
                "version": version,
                "wheels": [
                    {
                        "url": wheel.as_uri(),
                        "size": wheel.stat().st_size,
                        "hashes": {"sha256": sha256_file(wheel)},
                    }
                ],
            }
        )
    document = {"lock-version": "1.0", "created-by": "envbuilder-bench", "packages": packages}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(document), encoding="utf-8")


def _wheel(directory: Path, name: str, version: str, payload: int, *, seed: int) -> Path:
    """A real, reproducible wheel of ``payload`` incompressible bytes (stored, not deflated)."""
    module = name.replace("-", "_")
    path = directory / f"{module}-{version}-py3-none-any.whl"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{module}-{version}.dist-info"
    members = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{module}/payload.bin": random.Random(seed).randbytes(payload),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envbuilder-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in members.items()
    ]
    members[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    with atomic_writer(path) as f, zipfile.ZipFile(f, "w") as archive:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            archive.writestr(info, data)
    return path
