"""``envbuilder matrix``: the GitHub Actions job matrix for the selected combinations."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands._args import add_matrix_argument, add_selectors

if TYPE_CHECKING:
    from envbuilder.ghmatrix import Chunk, Estimate, JobMatrix
    from envbuilder.model import Combination
    from envbuilder.reporter import Reporter

HELP = (
    "print the GitHub Actions job matrix (one job per resolvable combination), in chunks"
    " that fit GitHub's limits, and what it costs (--estimate)"
)

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
        help="also append count=<N>, chunks=<JSON list of chunk numbers>, chunk-<K>=<JSON>"
        " for each chunk, build-chunks=<JSON list> and build-<K>=<JSON> for each chunk of"
        " the images to build to FILE (in a workflow: $GITHUB_OUTPUT)",
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="print the run's jobs and GPU-runner minutes, from the suite's measured"
        " per-group costs (json: also the 'estimate' key)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="estimate runs of the suite with --quick (default: the full suite)",
    )
    parser.add_argument(
        "--overhead-minutes",
        type=float,
        default=0.0,
        metavar="M",
        help="add M minutes per job for setup and the image (not measured by the suite)",
    )


def run(args: argparse.Namespace) -> int:
    from envbuilder.ghmatrix import chunk_plan, estimate
    from envbuilder.reporter import Reporter

    reporter = Reporter(verbose=args.verbose)
    selected, plan = _plan(args)
    chunks = chunk_plan(plan.jobs)
    build_chunks = plan.build_chunks()
    cost = None
    if args.estimate:
        cost = estimate(
            plan, size="quick" if args.quick else "full", overhead_s=args.overhead_minutes * 60
        )

    _report_not_run(plan, reporter)
    if cost is not None:
        reporter.summary(f"### Cost of this run\n\n{cost.describe()}\n")

    if args.github_output is not None:
        _append_github_output(args.github_output, plan, chunks, build_chunks)

    _print_plan(args.format, plan, chunks, cost)
    # Rows of another platform resolved fine: they have no image to run, not no answer.
    other_platform = sum(1 for n in plan.not_run if n.status == "skipped")
    unresolvable = len(plan.not_run) - other_platform
    reporter.line(
        f"{len(plan.jobs)} job(s) in {len(chunks)} chunk(s) for {len(selected)} selected"
        " combination(s)"
        + (f", {unresolvable} not resolvable" if unresolvable else "")
        + (f", {other_platform} skipped for their platform (no image)" if other_platform else "")
    )
    if cost is not None:
        reporter.line(cost.describe())
    return 0


def _plan(args: argparse.Namespace) -> tuple[Sequence[Combination], JobMatrix]:
    """The selected combinations and their jobs (only the resolved ones with ``--resolution``)."""
    import logging

    from envbuilder.ghmatrix import plan_jobs
    from envbuilder.model import load_resolution
    from envbuilder.resolve.matrix import load_matrix

    log = logging.getLogger("envbuilder.resolve.matrix")
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
    return selected, plan_jobs(selected, gpus=matrix.runners.gpus, resolution=resolution)


def _report_not_run(plan: JobMatrix, reporter: Reporter) -> None:
    """Each combination without a job: a line (an Actions annotation there) and a summary table."""
    from envbuilder.ghmatrix import workflow_command

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


def _append_github_output(
    path: Path, plan: JobMatrix, chunks: Sequence[Chunk], build_chunks: Sequence[Chunk]
) -> None:
    """The job count and each chunk's matrix, appended to ``path`` ($GITHUB_OUTPUT)."""
    from envbuilder.ghmatrix import compact, github_output

    values = {
        "count": str(len(plan.jobs)),
        "chunks": compact([c.index for c in chunks]),
        **{c.output: compact(c.github()) for c in chunks},
        "build-chunks": compact([c.index for c in build_chunks]),
        **{c.output: compact(c.github()) for c in build_chunks},
    }
    text = github_output(values)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def _print_plan(
    output_format: str, plan: JobMatrix, chunks: Sequence[Chunk], cost: Estimate | None
) -> None:
    """The plan on stdout in ``--format``: github, ids, or json (with chunks and estimate)."""
    import json

    from envbuilder.ghmatrix import compact

    if output_format == "github":
        print(compact(plan.github()))
    elif output_format == "ids":
        for job in plan.jobs:
            print(job.id + (f" {job.gpu}" if job.gpu else ""))
    else:
        document = plan.to_json()
        document["chunks"] = [
            {"output": c.output, "count": len(c.jobs), "bytes": c.size()} for c in chunks
        ]
        if cost is not None:
            document["estimate"] = cost.to_json()
        print(json.dumps(document, indent=2))
