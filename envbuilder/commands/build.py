"""``envbuilder build``: one Docker image per resolved combination, from its lock alone."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands._args import add_matrix_argument, add_selectors
from envbuilder.errors import InputError

if TYPE_CHECKING:
    from envbuilder.docker.cache import WheelCache
    from envbuilder.docker.client import DockerClient
    from envbuilder.model import Combination, ResolvedCombination
    from envbuilder.reporter import Reporter

HELP = "build one Docker image per resolved combination from its lock (tag envbuilder/<id>:<lock sha256[:12]>)"


def configure(parser: argparse.ArgumentParser) -> None:
    # `--all` and the question when neither it nor a selector is given: cli.ASK_FOR_SELECTION
    add_selectors(parser, none_means="nothing (name combinations, or --all)")
    parser.add_argument(
        "--locks",
        type=Path,
        default=Path("locks"),
        metavar="DIR",
        help="output of `envbuilder resolve` (default: %(default)s)",
    )
    add_matrix_argument(
        parser,
        default=None,
        help="matrix file for selectors and base images (default: the one the locks were resolved from)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="what every build does: make the layers from the lock (kept for scripts)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="make again even the layers this process made for an earlier combination",
    )
    parser.add_argument(
        "--keep-stages",
        action="store_true",
        help="keep the installed trees and layer tars of each build (for debugging)",
    )
    parser.add_argument(
        "--push", metavar="REGISTRY", default=None, help="push each image to REGISTRY (host:port)"
    )
    parser.add_argument(
        "--image-records",
        type=Path,
        default=None,
        metavar="DIR",
        help="push by digest (to --push, else $ENVBUILDER_REGISTRY; credentials from"
        " $ENVBUILDER_REGISTRY_USER and $ENVBUILDER_REGISTRY_PASSWORD) and write DIR/<id>.json,"
        " the record that"
        " `envbuilder conformance --image-records` pulls the image by; a record already there"
        " for the same lock and registry is kept and nothing is built (verify it first)",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="one build log per combination (default: LOCKS/build-logs)",
    )
    parser.add_argument(
        "--base-image",
        default=None,
        metavar="IMAGE",
        help="base image for every selected combination (default: base-image in the matrix)",
    )
    parser.add_argument(
        "--wheel-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="content-addressed wheel cache (default: $ENVBUILDER_WHEEL_CACHE or the user cache)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.docker.build import docker_client
    from envbuilder.docker.cache import WheelCache
    from envbuilder.model import load_resolution
    from envbuilder.reporter import Reporter
    from envbuilder.resolve.matrix import load_matrix

    reporter = Reporter(verbose=args.verbose)
    auth = _push_settings(args)
    locks: Path = args.locks
    resolution = load_resolution(locks / "resolution.json")
    matrix = load_matrix(args.matrix or Path(resolution.matrix))
    resolved = resolution.by_id()
    chosen = matrix.select(args.selectors)
    client = docker_client()
    settings = args.settings
    cache = WheelCache(args.wheel_cache or settings.wheel_cache, client=settings.http_client())
    log_dir: Path = args.log_dir or locks / "build-logs"
    target = _Target(client=client, cache=cache, log_dir=log_dir, auth=auth)
    built: list[str] = []
    skipped: list[str] = []
    for combination in chosen:
        rc = resolved.get(combination.id)
        why = _why_skipped(combination, rc, locks)
        if rc is None or why is not None:
            skipped.append(combination.id)
            reporter.line(f"- {combination.id}: skipped, {why}")
            continue
        built.append(_build_one(args, combination, rc, target, reporter))
    reporter.line(f"{len(built)} image(s) ready, {len(skipped)} combination(s) skipped")
    reporter.summary(
        "| image |\n|---|\n" + "".join(f"| `{t}` |\n" for t in built)
        if built
        else "no images built"
    )
    if not built:
        reporter.line(
            "nothing was built: every selected combination was skipped; "
            "resolve them (`nox -s resolve -- SELECTOR`) or select resolved ones"
        )
        return 1
    return 0


@dataclass(frozen=True, kw_only=True)
class _Target:
    """Where every image of a run is made and what it is pushed with."""

    client: DockerClient
    cache: WheelCache
    log_dir: Path
    auth: dict[str, str] | None  # the registry's credentials, for --image-records


def _push_settings(args: argparse.Namespace) -> dict[str, str] | None:
    """With ``--image-records``: ``args.push`` from $ENVBUILDER_REGISTRY where not given
    (refused when neither is), and the registry's credentials; otherwise None."""
    if args.image_records is None:
        return None
    import os

    from envbuilder.docker.registry import REGISTRY_VARIABLE, registry_auth

    args.push = args.push or os.environ.get(REGISTRY_VARIABLE) or None
    if not args.push:
        raise InputError(f"--image-records pushes: give --push REGISTRY or set {REGISTRY_VARIABLE}")
    return registry_auth(os.environ)


def _why_skipped(
    combination: Combination, rc: ResolvedCombination | None, locks: Path
) -> str | None:
    """Why the combination gets no image (not resolved, or a platform without images)."""
    from envbuilder.target import not_in_images

    if rc is None:
        return f"not in {locks / 'resolution.json'}; run `nox -s resolve -- {combination.id}`"
    if rc.status != "resolved":
        return f"{rc.status}: {rc.reason}"
    return not_in_images(combination.platform)


def _build_one(
    args: argparse.Namespace,
    combination: Combination,
    rc: ResolvedCombination,
    target: _Target,
    reporter: Reporter,
) -> str:
    """Make one combination's image and push it where asked; what it prints first (its
    tag, or a kept record's reference when its lock did not change)."""
    from envbuilder.docker.build import (
        ImageRequest,
        base_image_for,
        lock_path,
        make_image,
        push_image,
    )
    from envbuilder.sourcebuild.image import image_wheel

    client = target.client
    base = args.base_image or base_image_for(combination.base_image, combination.python)
    lock = lock_path(rc, args.locks)
    request = ImageRequest(
        resolved=rc,
        lock_path=lock,
        force=args.force,
        base_image=base,
        log_dir=target.log_dir,
        cache=target.cache,
        revision=args.settings.revision,
        no_cache=args.no_cache,
        keep_stages=args.keep_stages,
        built_wheel=image_wheel(rc, lock, target.cache),
    )
    if args.push and args.image_records is not None:
        kept = _kept_record(args.image_records / f"{rc.id}.json", lock, args.push)
        if kept is not None:
            reporter.line(f"✓ {rc.id}: its lock did not change; {kept} is kept, not built")
            print(kept, flush=True)
            return kept
    made = make_image(request, client=client, reporter=reporter)
    print(made.tag, flush=True)
    if args.push and args.image_records is not None:
        from envbuilder.docker.plan import lock_digest
        from envbuilder.docker.registry import push_by_digest
        from envbuilder.files import write_atomic

        record = push_by_digest(
            client,
            made.id,
            combination=rc.id,
            lock_sha256=lock_digest(lock.read_bytes()),  # what make_image built from
            registry=args.push,
            auth=target.auth,
            reporter=reporter,
        )
        write_atomic(args.image_records / f"{rc.id}.json", record.dumps())
        print(record.reference, flush=True)
    elif args.push:
        print(push_image(client, made.tag, args.push, reporter=reporter), flush=True)
    return made.tag


def _kept_record(path: Path, lock: Path, registry: str) -> str | None:
    """The reference of the record at ``path`` when it names this lock's image in
    ``registry``; None when there is none or it names another (the image is built)."""
    from envbuilder.docker.plan import lock_digest
    from envbuilder.docker.registry import ImageRecord, registry_reference

    if not path.is_file():
        return None
    record = ImageRecord.loads(path.read_text(encoding="utf-8"), source=str(path))
    if record.lock_sha256 != lock_digest(lock.read_bytes()):
        return None
    if record.registry != registry_reference(registry):
        return None
    return record.reference
