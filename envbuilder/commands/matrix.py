"""``envbuilder matrix``: the GitHub Actions job matrix for the selected combinations."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuilder.commands._args import add_matrix_argument, add_selectors

HELP = "print the GitHub Actions job matrix (one job per resolvable combination)"

FORMATS = ("json", "github", "ids")


def configure(parser: argparse.ArgumentParser) -> None:
    add_selectors(parser)
    add_matrix_argument(parser)
    parser.add_argument(
        "--resolution",
        type=Path,
        default=None,
        metavar="FILE",
        help="resolution.json from `envbuilder resolve`: only resolved combinations get"
        " jobs, with their image tag (e.g. locks/resolution.json)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="json",
        help="json: include, count and not_run, indented; github: the one-line object for"
        " strategy.matrix; ids: one id per line (default: %(default)s)",
    )
    parser.add_argument(
        "--github-output",
        type=Path,
        default=None,
        metavar="FILE",
        help="also append matrix=<JSON> and count=<N> to FILE (in a workflow: $GITHUB_OUTPUT)",
    )


def run(args: argparse.Namespace) -> int:
    import json
    import logging

    from envbuilder.ghmatrix import compact, github_output, plan_jobs, workflow_command
    from envbuilder.model import load_resolution
    from envbuilder.reporter import Reporter
    from envbuilder.resolve.matrix import load_matrix

    log = logging.getLogger("envbuilder.resolve.matrix")
    reporter = Reporter(verbose=args.verbose)
    matrix = load_matrix(args.matrix)
    selected = matrix.select(args.selectors)
    resolution = None
    if args.resolution is not None:
        resolution = load_resolution(args.resolution)
        if resolution.matrix_sha256 != matrix.sha256:
            log.warning(
                "%s was resolved from another version of %s; re-run `nox -s resolve`"
                " if the selected combinations changed",
                args.resolution,
                args.matrix,
            )
    plan = plan_jobs(selected, gpus=matrix.runners.gpus, resolution=resolution)

    for skipped in plan.not_run:
        message = f"{skipped.id}: {skipped.status}: {skipped.reason}"
        if reporter.in_actions:
            reporter.line(
                workflow_command(
                    "warning" if skipped.status == "error" else "notice",
                    message,
                    title="No conformance job",
                )
            )
        else:
            reporter.line(f"not run: {message}")
    if plan.not_run:
        rows = "\n".join(f"| `{n.id}` | {n.status} | {n.reason} |" for n in plan.not_run)
        reporter.summary(
            "### Combinations without a conformance job\n\n"
            f"| combination | status | reason |\n| --- | --- | --- |\n{rows}\n"
        )

    if args.github_output is not None:
        text = github_output({"matrix": compact(plan.github()), "count": str(len(plan.jobs))})
        with args.github_output.open("a", encoding="utf-8") as f:
            f.write(text)

    if args.format == "github":
        print(compact(plan.github()))
    elif args.format == "ids":
        for job in plan.jobs:
            print(job.id + (f" {job.gpu}" if job.gpu else ""))
    else:
        print(json.dumps(plan.to_json(), indent=2))
    reporter.line(
        f"{len(plan.jobs)} job(s) for {len(selected)} selected combination(s)"
        + (f", {len(plan.not_run)} not resolvable" if plan.not_run else "")
    )
    return 0
