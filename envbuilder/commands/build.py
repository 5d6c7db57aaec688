"""``envbuilder build``: one Docker image per resolved combination, from its lock alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuilder.commands._args import add_matrix_argument, add_selectors

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
        "--force", action="store_true", help="rebuild even when an image with the lock's tag exists"
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="with --force: make every layer again instead of reusing the layer cache",
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
        ensure_image,
        lock_path,
        push_image,
    )
    from envbuilder.docker.cache import WheelCache
    from envbuilder.model import load_resolution
    from envbuilder.reporter import Reporter
    from envbuilder.resolve.matrix import load_matrix
    from envbuilder.sourcebuild.image import image_wheel

    reporter = Reporter(verbose=args.verbose)
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
        tag = ensure_image(request, client=client, reporter=reporter)
        built.append(tag)
        print(tag, flush=True)
        if args.push:
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
