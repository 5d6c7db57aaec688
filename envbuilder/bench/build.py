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
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envbuilder.bench._build_cases import (
    MB,
    Case,
    cases_sharing_a_runtime,
    named_cases,
    rest_changed,
    synthetic_cases,
)
from envbuilder.docker.build import (
    DOCKER_DIR,
    SUITE_GROUP,
    BuildFailed,
    ImageRequest,
    docker_client,
    ensure_image,
    link_wheels,
    source_revision,
    suite_wheels,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.client import DockerClient
from envbuilder.docker.layers import chain_ids
from envbuilder.docker.plan import (
    image_tag,
    install_requirements,
    load_lock,
    lock_digest,
    plan_layers,
)
from envbuilder.errors import EnvbuilderError, InputError
from envbuilder.reporter import Reporter
from envbuilder.settings import Settings
from envbuilder.sourcebuild.image import image_wheel

__all__ = ["main"]

TEST_BASE = "envbuilder-test/python:3.11"
DISK_TARGET = 0.60
REBUILD_TARGET_S = 5.0
IMPORT_TARGET_S = 2.0
COLD_RATIO_TARGET = 0.5
REST_ONLY_TARGET_S = 10.0
#: The label of envbuilder/docker/recipe/Dockerfile.naive's install stage.
NAIVE_STAGE_LABEL = "io.envbuilder.bench.naive-stage"


def main(argv: Sequence[str]) -> int:
    try:
        return _main(argv)
    except EnvbuilderError as e:
        print(f"bench build: error: {e}", file=sys.stderr)
        return e.return_code


def _main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.repeat < 2:
        raise InputError("--repeat must be at least 2: two cold builds show whether ids agree")
    reporter = Reporter(verbose=args.verbose)
    client = docker_client()
    settings = Settings.from_environment(os.environ)
    cache = WheelCache(settings.wheel_cache, client=settings.http_client())
    cases, base, mode = _cases(args, cache)
    log_dir = cache.root.parent / "bench-logs"
    print(f"bench build: mode={mode}; base image {base or 'python:<python>-slim'}", flush=True)
    builder = _Builder(
        client=client, cache=cache, base=base, log_dir=log_dir, reporter=reporter,
        quiet=Reporter(io.StringIO()),
        # one revision label for the whole run: commits meanwhile would change the image ids
        revision=source_revision(settings.revision),
    )  # fmt: skip
    missed: list[str] = []
    layered: dict[str, str] = {}
    naive: dict[str, str] = {}
    for case in cases:
        cid = case.resolved.id
        cold = _cold_builds(builder, case, repeat=args.repeat)
        layered[cid], naive[cid] = cold.layered, cold.naive
        warm = _warm_runs(builder, case, cold, repeat=args.repeat, synthetic=args.synthetic)
        checks = _case_checks(cold, warm)
        print(_case_report(cid, cold, warm, checks), flush=True)
        missed += [f"{cid}: {what}" for what, ok in checks if not ok]
    shared = len(cases) >= 3 and not args.combination
    base_ref = base or f"python:{cases[0].resolved.python}-slim"
    missed += _disk_check(
        client, list(layered.values()), list(naive.values()), base_ref, shared=shared
    )
    if missed:
        print(f"bench build: {len(missed)} target(s) missed: {'; '.join(missed)}", flush=True)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
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
    return parser


def _cases(args: argparse.Namespace, cache: WheelCache) -> tuple[list[Case], str | None, str]:
    """The cases to measure, the base image (``None``: per Python) and the mode's description;
    the synthetic mode makes the test base image when it is the one used."""
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
        return cases, base, mode
    if args.combination:
        cases = named_cases(args.locks, args.combination)
    else:
        cases = cases_sharing_a_runtime(args.locks, python=args.python)
    mode = f"real locks from {args.locks} ({', '.join(c.resolved.id for c in cases)})"
    return cases, args.base_image, mode


@dataclass(frozen=True, kw_only=True)
class _Builder:
    """What every build of the run shares: the daemon, the wheel cache, the base image and
    one revision label."""

    client: DockerClient
    cache: WheelCache
    base: str | None
    log_dir: Path
    reporter: Reporter
    quiet: Reporter
    revision: str

    def request(self, case: Case, **kwargs: Any) -> ImageRequest:
        return ImageRequest(
            resolved=case.resolved, lock_path=case.lock, base_image=self.base,
            log_dir=self.log_dir, cache=self.cache,
            built_wheel=image_wheel(case.resolved, case.lock, self.cache),
            revision=self.revision, **kwargs,
        )  # fmt: skip

    def layered(self, case: Case, **kwargs: Any) -> str:
        return ensure_image(
            self.request(case, **kwargs), client=self.client, reporter=self.reporter
        )


@dataclass(frozen=True, kw_only=True)
class _ColdBuilds:
    """One case's builds from cold, layered and naive interleaved, in seconds."""

    first: float
    """The first layered build, which makes the base's compiler layer."""
    layered_s: list[float]
    naive_s: list[float]
    rest_only_s: list[float]
    ids: list[str]
    loads: list[float]
    layered: str
    """The tag of the last layered build."""
    naive: str
    """The tag of the last naive build."""


@dataclass(frozen=True, kw_only=True)
class _WarmRuns:
    """One case's rebuilds with nothing changed and its containers' starts."""

    force_s: list[float]
    modules: list[str]
    start_layered_s: list[float]
    start_naive_s: list[float]
    bytecode: int


def _cold_builds(builder: _Builder, case: Case, *, repeat: int) -> _ColdBuilds:
    client, cid = builder.client, case.resolved.id
    # the base's compiler layer, made once in this process (apt beside the first install)
    _remove(client, image_tag(cid, lock_digest(case.lock.read_bytes())))
    start = time.monotonic()
    builder.layered(case, force=True, no_cache=True)
    first = time.monotonic() - start
    cold_layered: list[float] = []
    cold_naive: list[float] = []
    rest_only: list[float] = []
    ids: list[str] = []
    loads: list[float] = []
    layered = naive = ""
    for i in range(repeat):
        loads.append(os.getloadavg()[0])
        _remove(client, image_tag(cid, lock_digest(case.lock.read_bytes())))
        start = time.monotonic()
        layered = builder.layered(case, force=True, no_cache=True)
        cold_layered.append(time.monotonic() - start)
        ids.append(str(client.images.get(layered).id))
        work = builder.log_dir.parent / "bench-rest-only"
        changed = rest_changed(case, work=work, version=f"1.{i}")
        start = time.monotonic()
        changed_tag = builder.layered(changed)
        rest_only.append(time.monotonic() - start)
        _remove(client, changed_tag)
        loads.append(os.getloadavg()[0])
        _remove(client, naive_tag(case))
        start = time.monotonic()
        naive = naive_image(
            client, case, builder.base, builder.cache, builder.log_dir, builder.reporter
        )
        cold_naive.append(time.monotonic() - start)
    print(
        f"  {cid}: cold layered {_spread(cold_layered)}, naive {_spread(cold_naive)}, "
        f"rest-only change {_spread(rest_only)}",
        flush=True,
    )
    return _ColdBuilds(
        first=first, layered_s=cold_layered, naive_s=cold_naive, rest_only_s=rest_only,
        ids=ids, loads=loads, layered=layered, naive=naive,
    )  # fmt: skip


def _warm_runs(
    builder: _Builder, case: Case, cold: _ColdBuilds, *, repeat: int, synthetic: bool
) -> _WarmRuns:
    client = builder.client
    force: list[float] = []
    for _ in range(repeat):
        start = time.monotonic()
        ensure_image(builder.request(case, force=True), client=client, reporter=builder.quiet)
        force.append(time.monotonic() - start)
    # the synthetic xformers is one module; the real one's attention lives in xformers.ops
    xformers = "xformers" if synthetic else "xformers.ops"
    modules = ["torch"] + ([xformers] if "xformers" in _locked(case) else [])
    return _WarmRuns(
        force_s=force,
        modules=modules,
        start_layered_s=[start_to_import(client, cold.layered, modules) for _ in range(repeat)],
        start_naive_s=[start_to_import(client, cold.naive, modules) for _ in range(repeat)],
        bytecode=bytecode_bytes(client, cold.layered),
    )


def _case_checks(cold: _ColdBuilds, warm: _WarmRuns) -> list[tuple[str, bool]]:
    """Each of a case's targets and whether it was met."""
    layered_median = statistics.median(cold.layered_s)
    naive_median = statistics.median(cold.naive_s)
    return [
        (
            f"cold layered ≤ {COLD_RATIO_TARGET} × naive",
            layered_median <= COLD_RATIO_TARGET * naive_median,
        ),
        (
            f"rest-only change ≤ {REST_ONLY_TARGET_S:.0f} s",
            statistics.median(cold.rest_only_s) <= REST_ONLY_TARGET_S,
        ),
        (f"--force no-change ≤ {REBUILD_TARGET_S:.0f} s", max(warm.force_s) <= REBUILD_TARGET_S),
        ("one image id from every --no-cache build", len(set(cold.ids)) == 1),
        (
            f"start to import ≤ {IMPORT_TARGET_S} s",
            statistics.median(warm.start_layered_s) <= IMPORT_TARGET_S,
        ),
    ]


def _case_report(
    cid: str, cold: _ColdBuilds, warm: _WarmRuns, checks: Sequence[tuple[str, bool]]
) -> str:
    layered_median = statistics.median(cold.layered_s)
    naive_median = statistics.median(cold.naive_s)
    ratios = [a / b for a, b in zip(cold.layered_s, cold.naive_s, strict=True)]
    return (
        f"{cid}:\n"
        f"  first build of the base (compiler layer made) {cold.first:.2f} s\n"
        f"  cold build      layered {_spread(cold.layered_s)}, naive {_spread(cold.naive_s)} "
        f"(ratio {layered_median / naive_median:.2f}; per pair "
        f"{', '.join(f'{r:.2f}' for r in ratios)})\n"
        f"  rest-only change {_spread(cold.rest_only_s)}\n"
        f"  --force no-change rebuild {_spread(warm.force_s)}\n"
        f"  --no-cache image ids {', '.join(i.removeprefix('sha256:')[:19] for i in cold.ids)}\n"
        f"  start to `import {', '.join(warm.modules)}`: layered {_spread(warm.start_layered_s)}, "
        f"naive {_spread(warm.start_naive_s)}; bytecode adds {warm.bytecode / MB:.1f} MB to the image\n"
        f"  load average (1 min) during the builds: {_spread(cold.loads, unit='')}\n"
        + "".join(f"  {'✓' if ok else '✕'} {what}\n" for what, ok in checks)
    )


def _disk_check(
    client: DockerClient,
    layered: Sequence[str],
    naive: Sequence[str],
    base_ref: str,
    *,
    shared: bool,
) -> list[str]:
    """Prints the disk the images' distinct layers take above ``base_ref``; the target can be
    missed (one line returned) only where three combinations share a runtime."""
    layered_bytes, layered_layers = unique_layers(client, layered, base_ref)
    naive_bytes, naive_layers = unique_layers(client, naive, base_ref)
    ratio = layered_bytes / naive_bytes
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
        return [f"disk ratio {ratio:.2f} > {DISK_TARGET:.2f}"]
    return []


def _spread(times: Sequence[float], *, unit: str = " s") -> str:
    return f"median {statistics.median(times):.2f}{unit} ({min(times):.2f}–{max(times):.2f}, n={len(times)})"


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
