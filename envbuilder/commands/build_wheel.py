"""``envbuilder build-wheel ID``: build a combination's xformers from its locked sdist."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.model import ResolvedCombination, SourceBuild
    from envbuilder.reporter import Reporter
    from envbuilder.sourcebuild.builder import BuildOutcome, BuildPlan

HELP = "build a source-build combination's xformers wheel from its locked sdist, hermetically and cached"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "combination", metavar="ID", help="a combination resolved as a source build"
    )
    parser.add_argument(
        "--locks",
        type=Path,
        default=Path("locks"),
        metavar="DIR",
        help="output of `envbuilder resolve` (default: %(default)s)",
    )
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="build in a scratch venv on this host (with its torch) instead of a container",
    )
    parser.add_argument(
        "--toolchain",
        choices=("wheels", "host"),
        default="wheels",
        help="the locked CUDA compiler wheels (default), or with --in-place the host's nvcc "
        "(its identity goes into the build key)",
    )
    parser.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="with --in-place: the interpreter to build with (default: this one)",
    )
    parser.add_argument(
        "--builder-image",
        default=None,
        metavar="IMAGE",
        help="image with python3 (venv) and a C++ compiler to build in (default: python:{python})",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="MAX_JOBS for the compiler (default: CPU count)",
    )
    parser.add_argument(
        "--wheel-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="where locked files are fetched to (default: $ENVBUILDER_WHEEL_CACHE or the user cache)",
    )
    parser.add_argument(
        "--build-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="built wheels by build key (default: source-builds in the user cache)",
    )
    parser.add_argument(
        "--fetch-only",
        action="store_true",
        help="only fetch the sdist and the build group into --wheel-cache (to carry offline)",
    )
    parser.add_argument(
        "--force", action="store_true", help="build even when the cache holds the key"
    )
    parser.add_argument(
        "--assets",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write the wheel and its build record into DIR under the names they are "
        "published by beside the lockfile (the GPU matrix run's release assets)",
    )
    parser.add_argument("--json", action="store_true", help="print the build record on stdout")


def run(args: argparse.Namespace) -> int:
    from envbuilder.docker.build import docker_client
    from envbuilder.docker.cache import WheelCache
    from envbuilder.errors import InputError
    from envbuilder.reporter import Reporter
    from envbuilder.sourcebuild.builder import BuildFailed, build_wheel
    from envbuilder.sourcebuild.cache import BuiltWheelCache

    reporter = Reporter(verbose=args.verbose)
    settings = args.settings
    if args.toolchain == "host" and not args.in_place:
        raise InputError("--toolchain host needs --in-place: a container has no host nvcc")
    resolved, build = _source_build(args)
    plan = _build_plan(args, resolved, build)
    files = WheelCache(args.wheel_cache or settings.wheel_cache, client=settings.http_client())
    if args.fetch_only:
        wanted = (plan.sdist, *plan.group_for(args.toolchain), *plan.runtime)
        with reporter.step(f"fetch {len(wanted)} locked file(s) into {files.root}"):
            files.fetch_all(wanted)
        return 0
    cache = BuiltWheelCache(args.build_cache or settings.cache_dir / "source-builds")
    log_path = args.locks / "build-logs" / f"{resolved.id}.wheel.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    client = None if args.in_place else docker_client()
    image = args.builder_image or f"python:{resolved.python}"
    where = "in place" if args.in_place else f"in {image} (network none)"
    with reporter.step(f"build-wheel {resolved.id} {where}, toolchain {args.toolchain}") as step:
        try:
            outcome = build_wheel(
                plan,
                mode="in-place" if args.in_place else "docker",
                cache=cache,
                files=files,
                toolchain=args.toolchain,
                builder_image=None if args.in_place else image,
                client=client,
                python=args.python,
                jobs=args.jobs,
                log_path=log_path,
                force=args.force,
            )
        except BuildFailed:
            step.fail()
            reporter.line(f"log: {log_path}")
            raise
    _report(args, resolved.id, outcome, reporter)
    return 0


def _source_build(args: argparse.Namespace) -> tuple[ResolvedCombination, SourceBuild]:
    """The combination ``args.combination`` of the resolution and its source build, refused
    unless it is resolved as one with a locked build group."""
    from envbuilder.errors import InputError
    from envbuilder.model import load_resolution

    resolution = load_resolution(args.locks / "resolution.json")
    resolved = resolution.by_id().get(args.combination)
    if resolved is None:
        raise InputError(
            f"{args.locks / 'resolution.json'}: no combination {args.combination!r}; "
            f"run `nox -s resolve -- {args.combination}`"
        )
    build = resolved.source_build
    if resolved.status != "resolved" or build is None or not build.build_lock:
        raise InputError(
            f"{resolved.id} is {resolved.status} and has no locked source build "
            "(set xformers-source in matrix.toml and resolve it)"
        )
    return resolved, build


def _build_plan(
    args: argparse.Namespace, resolved: ResolvedCombination, build: SourceBuild
) -> BuildPlan:
    """What the build reads: the locked sdist, the build group (checked against the hash
    the resolution records) and, in a container, the combination's lock."""
    from envbuilder.docker.build import lock_path
    from envbuilder.docker.plan import LockedWheel, load_lock
    from envbuilder.sourcebuild.builder import BuildPlan

    assert resolved.torch is not None
    build_lock, data = _build_group(args, resolved.id, build)
    sdist = LockedWheel(
        name="xformers",
        version=resolved.xformers.version if resolved.xformers else "",
        filename=build.sdist.filename,
        url=build.sdist.url,
        sha256=build.sdist.sha256,
        size=build.sdist.size,
    )
    runtime: tuple[LockedWheel, ...] = ()
    if not args.in_place:
        main = lock_path(resolved, args.locks)
        runtime = load_lock(main.read_bytes(), source=main)
    return BuildPlan(
        combination_id=resolved.id,
        python=resolved.python,
        sdist=sdist,
        build_group=load_lock(data, source=build_lock),
        runtime=runtime,
        torch_sha256=resolved.torch.sha256,
        arch_list=build.arch_list,
        flags=build.flags,
    )


def _build_group(
    args: argparse.Namespace, combination: str, build: SourceBuild
) -> tuple[Path, bytes]:
    """The build group's lock (its path and bytes), refused under its old name or when its
    sha256 is not the one the resolution records."""
    from envbuilder.docker.plan import lock_digest
    from envbuilder.errors import InputError
    from envbuilder.model import build_lock_filename, legacy_build_lock_filename

    assert build.build_lock  # `_source_build` refuses a build without one
    build_lock = Path(build.build_lock)
    build_lock = build_lock if build_lock.is_absolute() else args.locks.parent / build_lock
    if build_lock.name == legacy_build_lock_filename(combination):
        raise InputError(
            f"{args.locks / 'resolution.json'} names the build group {build_lock.name}, a name "
            "PEP 751 does not allow (no dot in pylock.<name>.toml); run `nox -s resolve -- "
            f"{combination}` (it renames it to {build_lock_filename(combination)}, offline too)"
        )
    try:
        data = build_lock.read_bytes()
    except OSError as e:
        raise InputError(
            f"cannot read the build group {build_lock} ({e.strerror}); run `nox -s resolve -- "
            f"{combination}`"
        ) from e
    if build.build_lock_sha256 and lock_digest(data) != build.build_lock_sha256:
        raise InputError(
            f"{build_lock}: sha256 {lock_digest(data)} is not the {build.build_lock_sha256} "
            "resolution.json records; resolve again"
        )
    return build_lock, data


def _report(
    args: argparse.Namespace, combination: str, outcome: BuildOutcome, reporter: Reporter
) -> None:
    """Write the build record beside the locks (and the assets where asked) and say what
    was built; the record on stdout with ``--json``."""
    from envbuilder.files import write_atomic
    from envbuilder.sourcebuild.cache import record_name

    record = outcome.built.record
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    write_atomic(args.locks / record_name(combination), text)
    how = "cache hit" if outcome.hit else "built"
    reporter.line(
        f"{how} in {outcome.seconds:.2f} s: {outcome.built.path.name} "
        f"sha256 {outcome.built.sha256}; key {outcome.key.digest}"
    )
    reporter.line(f"wheel: {outcome.built.path}")
    if args.assets is not None:
        from envbuilder.sourcebuild.published import write_assets

        asset, record_path = write_assets(outcome.built, combination, args.assets)
        reporter.line(f"assets: {asset} and {record_path.name}")
    cpp = record.get("cpp_lib") or {}
    if cpp:
        reporter.line(f"cpp_lib.json: {json.dumps(cpp.get('version'), sort_keys=True)}")
    if args.json:
        sys.stdout.write(text)
