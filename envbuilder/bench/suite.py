"""Benchmark: the conformance suite's wall time, ``--quick`` and full, on this machine's GPU.

    python -m envbuilder.bench suite [--quick-runs N] [--out DIR] [-- SUITE ARGS...]

Runs ``python -m envbuilder.conformance --quick`` ``--quick-runs`` times, then the full
suite once, each as users start it (a fresh process, timed from its start to its exit),
and prints each wall time against its goal and the anchor measured on an H200 before
this design (a freshly started machine: ``--quick`` 38 s, the full suite 200 s). Exit
status 1 when a goal is missed, 2 when a run wrote no results.

Every run starts with empty compiler caches, as on a freshly started machine: inductor's,
triton's and the CUDA driver's kernel caches point at a new empty folder per run (the
caches shared by the run's own processes stay shared). With root, the page cache is
dropped before each run too; otherwise the run says the files were warm.

The results files (``suite-N.quick.json``, ``suite.json``) can refresh the cost table
the schedule reads (``python -m envbuilder.conformance.costs DIR/*.json``).

Where the time went is printed from each results file: the phases (the groups that run
alone, then the rest), the fork server's imports, each group's processes and the slowest
units against their cost-table estimates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.bench._cold import drop_caches

__all__ = ["ANCHORS", "GOALS", "main"]

#: seconds, by run: the goal (issue 27) and the anchor measured before (freshly started H200)
GOALS: Mapping[str, float] = {"quick": 30.0, "full": 120.0}
ANCHORS: Mapping[str, float] = {"quick": 38.0, "full": 200.0}

#: the compiler caches a freshly started machine does not have
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")


@dataclass(frozen=True, kw_only=True)
class Timed:
    label: str
    size: str  # "quick" or "full"
    wall_s: float
    status: int
    results: dict[str, Any] | None
    cold_page_cache: bool

    @property
    def met(self) -> bool:
        return self.results is not None and self.wall_s <= GOALS[self.size]


def _run(label: str, size: str, out: Path, python: str, extra: Sequence[str]) -> Timed:
    command = [python, "-m", "envbuilder.conformance", "--out", str(out), *extra]
    if size == "quick":
        command.insert(3, "--quick")
    caches = Path(tempfile.mkdtemp(prefix=f"suite-bench-{label}-caches-"))
    env = dict(os.environ) | {name: str(caches / name.lower()) for name in CACHE_VARIABLES}
    cold = drop_caches()
    print(f"+ {' '.join(command)}", flush=True)
    log = out.with_suffix(".log")
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as sink:
        status = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - start
    results: dict[str, Any] | None = None
    if status in (0, 1) and out.is_file():  # 1: the suite ran and a gate check failed
        results = json.loads(out.read_text(encoding="utf-8"))
    else:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
        print(f"  {label}: exit status {status}, no results; last output:", file=sys.stderr)
        print("    " + "\n    ".join(tail), file=sys.stderr)
    return Timed(
        label=label, size=size, wall_s=wall, status=status, results=results, cold_page_cache=cold
    )


def _unit_table(results: Mapping[str, Any], size: str) -> list[str]:
    """The slowest units of the run against the cost table the schedule used."""
    from envbuilder.conformance.costs import known_costs, unit_costs

    measured = unit_costs(results.get("checks", []))
    table = known_costs(size)
    slowest = sorted(measured.items(), key=lambda kv: -kv[1])[:8]
    return [
        f"      {unit:<55} {seconds:6.1f}s (table {table.get(unit, float('nan')):5.1f}s)"
        for unit, seconds in slowest
    ]


def _profile(run: Timed) -> list[str]:
    if run.results is None:
        return []
    launch: Mapping[str, Any] = run.results.get("runner", {}).get("launch", {})
    checks = run.results.get("checks", [])
    groups: dict[str, float] = {}
    for check in checks:
        group = str(check.get("group"))
        groups[group] = groups.get(group, 0.0) + float(check.get("duration_s") or 0.0)
    preload = launch.get("preload_s")
    imports = "not through when the run ended" if preload is None else f"{preload}s"
    lines = [
        f"    {run.label}: {len(checks)} checks; jobs {launch.get('jobs')},"
        f" parts {launch.get('parts')}; fork server imports {imports}",
        f"      phases (s): {launch.get('phase_s')}",
        "      check seconds by group: "
        + ", ".join(f"{g} {s:.1f}" for g, s in sorted(groups.items(), key=lambda kv: -kv[1])),
    ]
    return lines + _unit_table(run.results, run.size)


def report(runs: Sequence[Timed]) -> tuple[list[str], bool]:
    """The table (each run against its goal and anchor) and whether every goal was met."""
    lines = [f"{'run':<10} {'wall':>8} {'goal':>7} {'anchor':>8} {'× anchor':>9}  verdict"]
    for run in runs:
        goal, anchor = GOALS[run.size], ANCHORS[run.size]
        verdict = "met" if run.met else ("NO RESULTS" if run.results is None else "MISSED")
        warm = "" if run.cold_page_cache else " (page cache warm: not root)"
        lines.append(
            f"{run.label:<10} {run.wall_s:7.1f}s {goal:6.0f}s {anchor:7.0f}s"
            f" {run.wall_s / anchor:8.2f}×  {verdict}{warm}"
        )
    lines.append("where the time went:")
    for run in runs:
        lines += _profile(run)
    return lines, all(run.met for run in runs)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_in:
        at = args_in.index("--")
        args_in, extra = args_in[:at], args_in[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m envbuilder.bench suite",
        description="Time the conformance suite (--quick and full) against its goals.",
    )
    parser.add_argument("--quick-runs", type=int, default=3, metavar="N", help="default: 3")
    parser.add_argument("--no-full", dest="full", action="store_false", help="skip the full run")
    parser.add_argument("--out", type=Path, help="folder for results and logs (default: temp)")
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    args = parser.parse_args(args_in)
    if args.quick_runs < 0:
        parser.error(f"--quick-runs {args.quick_runs}: give 0 or more")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="suite-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Timed] = []
    for n in range(1, args.quick_runs + 1):
        runs.append(_run(f"quick #{n}", "quick", out / f"suite-{n}.quick.json", args.python, extra))
    if args.full:
        runs.append(_run("full", "full", out / "suite.json", args.python, extra))
    if not runs:
        parser.error("nothing to run: give --quick-runs 1 or more, or leave out --no-full")
    lines, met = report(runs)
    print("\n".join(lines), flush=True)
    print(f"results and logs: {out}")
    if any(run.results is None for run in runs):
        return 2
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
