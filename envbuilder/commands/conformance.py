"""``envbuilder conformance``: run the conformance suite for selected combinations.

Each combination's image is built by this process from its lock
(``envbuilder.docker.build.make_image``; an image found under its tag is kept only
when it is those very bytes) and the suite runs in a container of that image, by
its id, with the host's GPUs (Docker device requests),
writing ``<--out>/<id>.json``. ``--in-place`` runs it in this environment
instead, after checking that this environment is the selected combination.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuilder.errors import InputError, MissingToolError
from envbuilder.model import Combination, verified_lock

if TYPE_CHECKING:
    from envbuilder.docker.build import ImageMade
    from envbuilder.docker.cache import WheelCache
    from envbuilder.docker.client import DockerClient
    from envbuilder.model import ResolvedCombination
    from envbuilder.reporter import Reporter

__all__ = ["HELP", "configure", "run"]

HELP = "run the torch.compile + attention conformance suite for selected combinations"

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "selectors", nargs="*", metavar="SELECTOR", help="ids, cu121, torch2.5, globs"
    )
    parser.add_argument(
        "--in-place", action="store_true", help="run in this environment, not a container"
    )
    parser.add_argument(
        "--force", action="store_true", help="with --in-place: run even if this environment differs"
    )
    parser.add_argument(
        "-o",
        "--out",
        dest="out_dir",
        type=Path,
        default=Path("results"),
        metavar="DIR",
        help="directory for <id>.json (default: results/)",
    )
    # the spelling before every command's output became -o/--out; kept for scripts that use it
    parser.add_argument("--out-dir", dest="out_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--quick", action="store_true", help="the smaller run (about 2 minutes per GPU)"
    )
    parser.add_argument(
        "--checks",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only the checks whose name matches PATTERN (a glob); repeatable",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="check processes run at once (default: 10 on a GPU, 1 on the CPU)",
    )
    parser.add_argument(
        "--locks",
        type=Path,
        default=Path("locks"),
        metavar="DIR",
        help="output of `envbuilder resolve` (default: locks/)",
    )
    parser.add_argument(
        "--matrix",
        type=Path,
        metavar="FILE",
        help="matrix file (default: the one the locks were resolved from)",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run without a GPU (CPU checks only, GPU checks skip)",
    )
    parser.add_argument(
        "--image-records",
        type=Path,
        default=None,
        metavar="DIR",
        help="pull the image of each combination with a record DIR/<id>.json by its digest"
        " and check it (`envbuilder build --push --image-records`) instead of building it",
    )


def _suite_argv(args: argparse.Namespace, combination: str, lock_sha256: str | None) -> list[str]:
    """The suite's options for ``python -m envbuilder.conformance`` in a container."""
    argv = ["--combination", combination]
    if lock_sha256:
        argv += ["--lock-sha256", lock_sha256]
    if args.quick:
        argv.append("--quick")
    for pattern in args.checks:
        argv += ["--checks", pattern]
    if args.jobs is not None:
        argv += ["--jobs", str(args.jobs)]
    return argv


def run(args: argparse.Namespace) -> int:
    from envbuilder.conformance.runner import pattern_problems
    from envbuilder.model import Resolution, load_resolution
    from envbuilder.resolve.matrix import load_matrix

    if problems := pattern_problems(args.checks):
        raise InputError("; ".join(problems))
    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"--jobs {args.jobs}: give 1 or more")
    resolution: Resolution | None = None
    resolution_path: Path = args.locks / "resolution.json"
    if resolution_path.is_file():
        resolution = load_resolution(resolution_path)
    elif not args.in_place:
        raise InputError(f"{resolution_path}: not found; run `nox -s resolve` first")
    matrix_path = args.matrix or (Path(resolution.matrix) if resolution else Path("matrix.toml"))
    chosen = load_matrix(matrix_path).select(args.selectors)
    locks = resolution.by_id() if resolution else {}
    if args.in_place:
        return _run_in_place(args, chosen, {k: v.lock_sha256 for k, v in locks.items()})
    return _run_in_containers(args, chosen, resolution, locks)


def _run_in_place(
    args: argparse.Namespace, chosen: Sequence[Combination], lock_sha: dict[str, str | None]
) -> int:
    from envbuilder.conformance.runner import (
        NoChecksSelected,
        NoCudaDevice,
        RunOptions,
        run_suite,
        summarize,
        unmatched_patterns,
    )

    combination, problems = _this_environment(args, chosen)
    sha = _claimed_lock(combination, problems, lock_sha)
    out = args.out_dir / combination.results_file
    if out.is_dir():
        raise InputError(f"{out}: is a directory; the results file goes there")
    try:
        results = run_suite(
            RunOptions(
                out=out,
                checks=tuple(args.checks),
                quick=args.quick,
                combination=combination.id,
                lock_sha256=sha,
                jobs=args.jobs,
                require_cuda=not args.allow_cpu,
            ),
            echo=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except NoChecksSelected as e:
        raise InputError(str(e)) from e
    except NoCudaDevice as e:
        raise MissingToolError(
            f"{e}; run on a GPU machine, or pass --allow-cpu to run only the CPU checks"
            " (GPU checks are recorded as skipped)"
        ) from e
    print(summarize(results), file=sys.stderr)
    for pattern in unmatched_patterns(args.checks, results):
        log.warning("--checks %r matched no check", pattern)
    print(out)
    return 0


def _this_environment(
    args: argparse.Namespace, chosen: Sequence[Combination]
) -> tuple[Combination, list[str]]:
    """The one selected combination this environment is, and how it differs from it (only
    with ``--force``, which runs the one selected combination whatever this environment is)."""
    from envbuilder.consumer.installed import (
        environment_mismatches,
        installed_version,
        torch_here,
    )

    torch_version, torch_cuda = torch_here()
    here = {
        "torch_version": torch_version,
        "torch_cuda": torch_cuda,
        "xformers_version": installed_version("xformers"),
    }
    problems = {c.id: environment_mismatches(c, **here) for c in chosen}
    matching = [c for c in chosen if not problems[c.id]]
    if not matching:
        if not args.force or len(chosen) != 1:
            detail = "\n".join(f"  {cid}: {'; '.join(p)}" for cid, p in problems.items())
            hint = "select one combination and pass --force" if len(chosen) != 1 else "pass --force"
            raise InputError(
                f"this environment is none of the selected combinations:\n{detail}\n"
                f"install the combination (envbuilder install) or {hint} to run anyway"
            )
        matching = list(chosen)
    if len(matching) > 1:
        raise InputError(
            "this environment matches several selected combinations: "
            + ", ".join(c.id for c in matching)
            + "; select one"
        )
    return matching[0], problems[matching[0].id]


def _claimed_lock(
    combination: Combination, problems: list[str], lock_sha: dict[str, str | None]
) -> str | None:
    """The lock hash the results claim: none where this environment differs from the lock."""
    sha = lock_sha.get(combination.id)
    if problems:
        # --force: the run is real, but this environment is not the lock; do not claim it is.
        log.warning(
            "%s: this environment differs (%s): lock_sha256 stays null",
            combination.id,
            "; ".join(problems),
        )
        sha = None
    elif sha is None:
        log.warning(
            "no lock hash for %s (no locks/resolution.json entry): lock_sha256 stays null",
            combination.id,
        )
    return sha


def _run_in_containers(
    args: argparse.Namespace,
    chosen: Sequence[Combination],
    resolution: Any,
    locks: dict[str, Any],
) -> int:
    _require_image_builder()
    from envbuilder.docker.build import docker_client
    from envbuilder.docker.cache import WheelCache
    from envbuilder.docker.run import gpu_request
    from envbuilder.reporter import Reporter

    settings = args.settings
    cache = WheelCache(settings.wheel_cache, client=settings.http_client())
    client = docker_client()
    devices = gpu_request(client, args.allow_cpu)
    reporter = Reporter(verbose=getattr(args, "verbose", 0))
    out_dir: Path = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for combination in chosen:
        resolved = locks.get(combination.id)
        if resolved is None:
            raise InputError(
                f"{args.locks / 'resolution.json'} has no {combination.id!r};"
                f" run `nox -s resolve -- {combination.id}`"
            )
        with reporter.step(f"conformance {combination.id}"):
            image = _image_of(
                args, combination, resolved, client=client, cache=cache, reporter=reporter
            )
            failure = _run_suite_in(
                args,
                combination,
                resolved,
                image,
                client=client,
                devices=devices,
                out_dir=out_dir,
                reporter=reporter,
            )
            if failure is not None:
                failed.append(failure)
    if failed:
        reporter.line("suite did not complete for: " + ", ".join(failed))
        return 1
    return 0


def _require_image_builder() -> None:
    """Refuse, naming ``--in-place``, where the Docker image builder cannot be imported."""
    import importlib

    try:
        for module in ("envbuilder.docker.build", "envbuilder.sourcebuild.image"):
            importlib.import_module(module)
    except ImportError as e:
        raise MissingToolError(
            f"the Docker image builder (envbuilder.docker.build) is not available: {e}; "
            "use --in-place to run in this environment"
        ) from e


def _image_of(
    args: argparse.Namespace,
    combination: Combination,
    resolved: ResolvedCombination,
    *,
    client: DockerClient,
    cache: WheelCache,
    reporter: Reporter,
) -> ImageMade:
    """The combination's image: pulled by the digest its record names where
    ``--image-records`` holds one (and checked), else made here from its lock."""
    from envbuilder.docker.build import (
        ImageMade,
        ImageRequest,
        base_image_for,
        lock_path,
        make_image,
    )
    from envbuilder.sourcebuild.image import image_wheel

    lock = lock_path(resolved, args.locks)
    request = ImageRequest(
        resolved=resolved,
        lock_path=lock,
        base_image=base_image_for(combination.base_image, combination.python),
        log_dir=args.locks / "build-logs",
        cache=cache,
        revision=args.settings.revision,
        built_wheel=image_wheel(resolved, lock, cache),
    )
    record = None if args.image_records is None else args.image_records / f"{combination.id}.json"
    if record is not None and record.is_file():
        import os

        from envbuilder.docker.registry import ImageRecord, pull_verified, registry_auth

        lock_sha256 = verified_lock(lock, resolved.lock_sha256)
        pulled = pull_verified(
            client,
            ImageRecord.loads(record.read_text(encoding="utf-8"), source=str(record)),
            combination=combination.id,
            lock_sha256=lock_sha256,
            auth=registry_auth(os.environ),
            reporter=reporter,
        )
        return ImageMade(tag=combination.image_tag(lock_sha256), id=pulled)
    return make_image(request, client=client, reporter=reporter)


def _run_suite_in(
    args: argparse.Namespace,
    combination: Combination,
    resolved: ResolvedCombination,
    image: ImageMade,
    *,
    client: DockerClient,
    devices: Sequence[Any],
    out_dir: Path,
    reporter: Reporter,
) -> str | None:
    """Run the suite in a container of ``image`` (by its id, whatever the tag names
    meanwhile) and print its results file; what failed, when it did not complete."""
    import envbuilder
    from envbuilder.docker.run import run_suite_container

    command = [
        "python",
        "-m",
        "envbuilder.conformance",
        "--out",
        f"/results/{combination.results_file}",
        *_suite_argv(args, combination.id, resolved.lock_sha256),
    ]
    reporter.command(["docker", "run", f"{image.id} ({image.tag})", *command])
    results = combination.results_file
    status, copied = run_suite_container(
        client,
        image.id,  # what was built now, whatever the tag names meanwhile
        command,
        devices=devices,
        suite_dir=Path(envbuilder.__file__).resolve().parent,
        out_dir=out_dir,
        results=results,
    )
    if copied != results:  # exit status 1 is also what an uncaught exception gives
        kept = f"; the checks that finished are in {out_dir / copied}" if copied else ""
        return f"{combination.id} (exit status {status}, no results written{kept})"
    if status not in (0, 1):  # 1: the suite ran and a gate check failed
        return f"{combination.id} (exit status {status})"
    print(out_dir / results)
    return None
