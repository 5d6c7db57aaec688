"""Benchmark of ``envbuilder build``: ``nox -s bench -- build [--synthetic]``.

Builds three combinations that share a CUDA runtime twice: with envbuilder's
layer plan, and naively (``docker/Dockerfile.naive``: the same lock installed
as one layer). It prints the disk their layers take above the base image,
each set counted once per distinct layer, and the time of a no-change
rebuild. Targets: layered ≤ 60% of naive; a no-change rebuild ≤ 5 s per
combination.

Real mode takes three resolved combinations from ``--locks`` whose locks pin
the same CUDA runtime wheels (multi-GB downloads). ``--synthetic`` generates
three locks of real wheels instead: a shared 200 MB runtime group, a 100 MB
torch-like wheel each and small rest, so the ratio can be measured anywhere.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import itertools
import os
import random
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from envbuilder.docker.build import (
    DOCKER_DIR,
    build_context,
    docker_build,
    docker_client,
    ensure_image,
    lock_path,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import (
    GROUPS,
    image_tag,
    install_requirements,
    load_lock,
    lock_digest,
    plan_layers,
)
from envbuilder.errors import EnvbuilderError, InputError
from envbuilder.files import atomic_writer
from envbuilder.model import ResolvedCombination, ResolvedTorch, load_resolution
from envbuilder.reporter import Reporter
from envbuilder.settings import Settings

__all__ = ["main"]

MB = 1_000_000
TEST_BASE = "envbuilder-test/python:3.11"
DISK_TARGET = 0.60
REBUILD_TARGET_S = 5.0


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
    parser.add_argument("--base-image", default=None, help="base image (default: per mode)")
    parser.add_argument(
        "--python", default=None, help="real mode: only combinations for this Python (e.g. 3.11)"
    )
    parser.add_argument("--runtime-mb", type=int, default=200, help="synthetic runtime group size")
    parser.add_argument("--torch-mb", type=int, default=100, help="synthetic torch wheel size")
    parser.add_argument("--work", type=Path, default=None, help="synthetic wheels and locks")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
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
    else:
        cases = cases_sharing_a_runtime(args.locks, python=args.python)
        base = args.base_image
        mode = f"real locks from {args.locks} ({', '.join(c.resolved.id for c in cases)})"
    log_dir = cache.root.parent / "bench-logs"
    print(f"bench build: mode={mode}; base image {base or 'python:<python>-slim'}", flush=True)

    layered: list[str] = []
    naive: list[str] = []
    for case in cases:
        start = time.monotonic()
        tag = ensure_image(
            case.resolved, case.lock, client=client, base_image=base, reporter=reporter,
            log_dir=log_dir, cache=cache,
        )  # fmt: skip
        layered.append(tag)
        built = time.monotonic() - start
        start = time.monotonic()
        naive.append(naive_image(client, case, base, cache, log_dir, reporter))
        print(
            f"  {case.resolved.id}: layered build {built:.1f} s, naive build {time.monotonic() - start:.1f} s",
            flush=True,
        )

    base_ref = base or f"python:{cases[0].resolved.python}-slim"
    layered_bytes, layered_layers = unique_layers(client, layered, base_ref)
    naive_bytes, naive_layers = unique_layers(client, naive, base_ref)
    ratio = layered_bytes / naive_bytes
    print(
        f"disk above the base, each distinct layer once:\n"
        f"  layered {layered_bytes / MB:9.1f} MB in {layered_layers} layers\n"
        f"  naive   {naive_bytes / MB:9.1f} MB in {naive_layers} layers\n"
        f"  ratio layered/naive = {ratio:.2f} (target ≤ {DISK_TARGET:.2f}) {'✓' if ratio <= DISK_TARGET else '✕'}",
        flush=True,
    )

    skip_times: list[float] = []
    rebuild_times: list[float] = []
    quiet = Reporter(io.StringIO())
    for case in cases:
        start = time.monotonic()
        ensure_image(case.resolved, case.lock, client=client, base_image=base, reporter=quiet, log_dir=log_dir, cache=cache)  # fmt: skip
        skip_times.append(time.monotonic() - start)
        start = time.monotonic()
        ensure_image(case.resolved, case.lock, client=client, base_image=base, reporter=quiet, log_dir=log_dir, cache=cache, force=True)  # fmt: skip
        rebuild_times.append(time.monotonic() - start)
    worst = max(rebuild_times)
    print(
        "no-change rebuild per combination:\n"
        f"  envbuilder build (image with the lock's tag exists): "
        f"{', '.join(f'{t:.2f}' for t in skip_times)} s\n"
        f"  --force (docker build through its layer cache):      "
        f"{', '.join(f'{t:.2f}' for t in rebuild_times)} s "
        f"(target ≤ {REBUILD_TARGET_S:.0f} s) {'✓' if worst <= REBUILD_TARGET_S else '✕'}",
        flush=True,
    )
    return 0 if ratio <= DISK_TARGET and worst <= REBUILD_TARGET_S else 1


def unique_layers(client: Any, tags: Sequence[str], base: str) -> tuple[int, int]:
    """Bytes and count of the distinct layers of ``tags`` above ``base``.

    A history entry's id is the image its build step made; images that share
    a layer share that step's image, so each id is counted once.
    """
    base_ids = {entry["Id"] for entry in client.api.history(base)}
    sizes: dict[str, int] = {}
    for tag in tags:
        for entry in client.api.history(tag):
            if entry["Id"] in base_ids or entry["Id"] == "<missing>":
                continue
            sizes[entry["Id"]] = int(entry["Size"])
    layers = sum(1 for size in sizes.values() if size > 0)
    return sum(sizes.values()), layers


def naive_image(
    client: Any, case: Case, base: str | None, cache: WheelCache, log_dir: Path, reporter: Reporter
) -> str:
    """The same lock as one install layer (``docker/Dockerfile.naive``)."""
    lock_bytes = case.lock.read_bytes()
    tag = (
        "envbuilder-bench/naive-"
        + image_tag(case.resolved.id, lock_digest(lock_bytes)).split("/", 1)[1]
    )
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
        return tag
    except ImageNotFound:
        pass
    plan = plan_layers(load_lock(lock_bytes, source=case.lock))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"naive-{case.resolved.id}.log"
    with build_context(plan, cache) as context, log_path.open("w", encoding="utf-8") as log:
        shutil.copyfile(DOCKER_DIR / "Dockerfile.naive", context / "Dockerfile")
        docker_build(
            client,
            path=str(context),
            tag=tag,
            buildargs={"BASE_IMAGE": base or f"python:{case.resolved.python}-slim"},
            log=log,
            log_path=log_path,
            reporter=reporter,
        )
    return tag


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
            id=combination_id,
            status="resolved",
            reason="synthetic benchmark combination",
            python="3.11",
            cuda="cu128",
            platform="manylinux_2_28_x86_64",
            torch=ResolvedTorch(
                version=torch_version,
                cuda="12.8",
                cuda_source="requires-dist",
                filename=torch.name,
                url=torch.as_uri(),
                sha256=_sha256(torch),
            ),
            lock=str(lock),
            lock_sha256=lock_digest(lock.read_bytes()),
        )
        cases.append(Case(resolved=resolved, lock=lock))
    return cases


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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
                        "hashes": {"sha256": _sha256(wheel)},
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
