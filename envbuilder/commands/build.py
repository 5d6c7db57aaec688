"""``envbuilder build``: one Docker image per resolved combination, from its lock alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuilder.commands._args import add_matrix_argument, add_selectors
from envbuilder.errors import InputError

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
    from envbuilder.docker.build import (
        ImageRequest,
        base_image_for,
        docker_client,
        lock_path,
        make_image,
        push_image,
    )
    from envbuilder.docker.cache import WheelCache
    from envbuilder.model import load_resolution
    from envbuilder.reporter import Reporter
    from envbuilder.resolve.matrix import load_matrix
    from envbuilder.sourcebuild.image import image_wheel
    from envbuilder.target import not_in_images

    reporter = Reporter(verbose=args.verbose)
    auth = None
    if args.image_records is not None:
        import os

        from envbuilder.docker.registry import REGISTRY_VARIABLE, registry_auth

        args.push = args.push or os.environ.get(REGISTRY_VARIABLE) or None
        if not args.push:
            raise InputError(
                f"--image-records pushes: give --push REGISTRY or set {REGISTRY_VARIABLE}"
            )
        auth = registry_auth(os.environ)
    locks: Path = args.locks
    resolution = load_resolution(locks / "resolution.json")
    matrix = load_matrix(args.matrix or Path(resolution.matrix))
    resolved = resolution.by_id()
    chosen = matrix.select(args.selectors)
    client = docker_client()
    settings = args.settings
    cache = WheelCache(args.wheel_cache or settings.wheel_cache, client=settings.http_client())
    log_dir: Path = args.log_dir or locks / "build-logs"
    built: list[str] = []
    skipped: list[str] = []
    for combination in chosen:
        rc = resolved.get(combination.id)
        if rc is None:
            skipped.append(combination.id)
            reporter.line(
                f"- {combination.id}: skipped, not in {locks / 'resolution.json'}; "
                f"run `nox -s resolve -- {combination.id}`"
            )
            continue
        if rc.status != "resolved":
            skipped.append(combination.id)
            reporter.line(f"- {combination.id}: skipped, {rc.status}: {rc.reason}")
            continue
        if (why := not_in_images(combination.platform)) is not None:
            skipped.append(combination.id)
            reporter.line(f"- {combination.id}: skipped, {why}")
            continue
        base = args.base_image or base_image_for(combination.base_image, combination.python)
        lock = lock_path(rc, locks)
        request = ImageRequest(
            resolved=rc,
            lock_path=lock,
            force=args.force,
            base_image=base,
            log_dir=log_dir,
            cache=cache,
            revision=settings.revision,
            no_cache=args.no_cache,
            keep_stages=args.keep_stages,
            built_wheel=image_wheel(rc, lock, cache),
        )
        if args.push and args.image_records is not None:
            kept = _kept_record(args.image_records / f"{rc.id}.json", lock, args.push)
            if kept is not None:
                reporter.line(f"✓ {rc.id}: its lock did not change; {kept} is kept, not built")
                built.append(kept)
                print(kept, flush=True)
                continue
        made = make_image(request, client=client, reporter=reporter)
        tag = made.tag
        built.append(tag)
        print(tag, flush=True)
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
                auth=auth,
                reporter=reporter,
            )
            write_atomic(args.image_records / f"{rc.id}.json", record.dumps())
            print(record.reference, flush=True)
        elif args.push:
            print(push_image(client, tag, args.push, reporter=reporter), flush=True)
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
