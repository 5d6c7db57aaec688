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

Every run's check statuses are compared with the committed run of the same combination
and size (``--expect DIR``, default ``results``: ``<combination>.<gpu>.json`` and
``<combination>.<gpu>.quick.json``, ``<gpu>`` the GPU name's last word, ``h200``); a
status that changed is a missed goal. ``--carried-caches`` runs each size once more with
the compiler caches its first run left (what carrying them in the image would move),
shown beside the others but not judged.

The runs import torch, dynamo and inductor in the fork server, and an image built by
envbuilder ships every package's bytecode (unchecked-hash ``.pyc`` files, a layer per
group). An environment without it compiles those modules' sources on every import: the
benchmark prints how many of the suite's packages' source files have bytecode, and
``--compile-bytecode`` compiles it first as the image does (``compileall``, unchecked-hash,
into the environment's site-packages), printing the time it took, so that the runs import
as they would in the image.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbuilder.bench._cold import drop_caches
from envbuilder.gpus import gpu_model

__all__ = ["ANCHORS", "GOALS", "committed_run", "main", "status_changes"]

#: seconds, by run: the goal (issue 27) and the anchor measured before (freshly started H200)
GOALS: Mapping[str, float] = {"quick": 30.0, "full": 120.0}
ANCHORS: Mapping[str, float] = {"quick": 38.0, "full": 200.0}

#: the packages the suite imports whose bytecode is counted (and compiled with
#: ``--compile-bytecode``: their whole site-packages folder, as the image does)
BYTECODE_PACKAGES = ("torch", "triton", "sympy", "xformers", "diffusers", "envbuilder")

#: run by the environment's interpreter: ``{package: [source files, with bytecode]}`` and
#: the site-packages folders holding them (a package outside one, a checkout: its own
#: folder); a package that is absent is left out
_BYTECODE_SCRIPT = """
import importlib.util, json, os, sys
counts, folders = {}, set()
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        continue
    sources = compiled = 0
    for root in spec.submodule_search_locations:
        parent = os.path.dirname(root)  # a site-packages folder whole, as the image compiles
        folders.add(parent if os.path.basename(parent) in ("site-packages", "dist-packages") else root)
        for here, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    sources += 1
                    cached = importlib.util.cache_from_source(os.path.join(here, f))
                    compiled += os.path.exists(cached)
    counts[name] = [sources, compiled]
print(json.dumps({"counts": counts, "folders": sorted(folders)}))
"""

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
    caches: Path | None = None  # the compiler caches it ran with
    carried_caches: bool = False  # they were left by an earlier run: not judged
    status_changes: tuple[str, ...] = ()  # against the committed run
    compared_with: str | None = None

    @property
    def met(self) -> bool:
        return (
            self.results is not None and self.wall_s <= GOALS[self.size] and not self.status_changes
        )


def status_changes(results: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """``name: before -> now`` for each check whose status differs from the committed
    run's (``absent`` where only one of them has it)."""
    now = {str(c["name"]): str(c["status"]) for c in results.get("checks", [])}
    before = {str(c["name"]): str(c["status"]) for c in expected.get("checks", [])}
    return [
        f"{name}: {before.get(name, 'absent')} -> {now.get(name, 'absent')}"
        for name in sorted(now.keys() | before.keys())
        if before.get(name) != now.get(name)
    ]


def committed_run(results: Mapping[str, Any], size: str, folder: Path) -> Path | None:
    """The committed results of the same combination and size on the same GPU model (the
    name's model: ``NVIDIA H100 80GB HBM3`` -> ``h100``), else on a GPU of the same compute
    capability (the same kernels run there: an H100 run compares with an H200 one)."""
    combination = results.get("combination")
    gpu = (results.get("runner", {}).get("gpus") or [{}])[0]
    name = str(gpu.get("name") or "")
    if not isinstance(combination, str) or not name.split():
        return None
    suffix = ".quick.json" if size == "quick" else ".json"
    model = (gpu_model(name) or name.split()[-1]).lower()
    path = folder / f"{combination}.{model}{suffix}"
    if path.is_file():
        return path
    capability = gpu.get("compute_capability")
    if not capability:
        return None
    for other in sorted(folder.glob(f"{combination}.*{suffix}")):
        rest = other.name[len(combination) + 1 : -len(suffix)]
        if "." in rest:  # another size's file, or another combination's
            continue
        try:
            ran = json.loads(other.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (ran.get("runner", {}).get("gpus") or [{}])[0].get("compute_capability") == capability:
            return other
    return None


def _compared(run: Timed, folder: Path | None) -> Timed:
    if run.results is None or folder is None:
        return run
    path = committed_run(run.results, run.size, folder)
    if path is None:
        return run
    expected = json.loads(path.read_text(encoding="utf-8"))
    changes = tuple(status_changes(run.results, expected))
    return replace(run, status_changes=changes, compared_with=str(path))


def _run(
    label: str,
    size: str,
    out: Path,
    python: str,
    extra: Sequence[str],
    caches: Path | None = None,
) -> Timed:
    command = [python, "-m", "envbuilder.conformance", "--out", str(out), *extra]
    if size == "quick":
        command.insert(3, "--quick")
    carried = caches is not None
    if caches is None:
        caches = Path(tempfile.mkdtemp(prefix=f"suite-bench-{size}-caches-"))
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
        label=label,
        size=size,
        wall_s=wall,
        status=status,
        results=results,
        cold_page_cache=cold,
        caches=caches,
        carried_caches=carried,
    )


def bytecode(python: str) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per package of `BYTECODE_PACKAGES`: its source files and how many have bytecode
    the interpreter would use; and the site-packages folders they are in."""
    found = subprocess.run(
        [python, "-c", _BYTECODE_SCRIPT, *BYTECODE_PACKAGES],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(found.stdout)
    counts = {name: (int(n[0]), int(n[1])) for name, n in data["counts"].items()}
    return counts, [str(f) for f in data["folders"]]


def bytecode_line(counts: Mapping[str, tuple[int, int]]) -> str:
    """One line saying how much of the suite's imports would compile sources."""
    parts = [f"{name} {done} of {total}" for name, (total, done) in counts.items()]
    missing = sum(total - done for total, done in counts.values())
    note = (
        "every source file has bytecode, as in the image"
        if not missing
        else f"{missing} source files without it compile on every import (the image ships "
        "their bytecode: --compile-bytecode compiles it as the image does)"
    )
    return f"bytecode: {', '.join(parts) or 'no package found'}; {note}"


def compile_bytecode(python: str, folders: Sequence[str]) -> float:
    """Compile ``folders`` as the image does (unchecked-hash .pyc); the seconds it took."""
    start = time.monotonic()
    command = [python, "-m", "compileall", "-q", "-j", "0"]
    command += ["--invalidation-mode", "unchecked-hash", *folders]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        # compileall exits 1 when a file does not compile (a test fixture written for
        # another Python); the rest is compiled, and the count printed after says so
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        print("  compileall: some files did not compile: " + " | ".join(tail), flush=True)
    return time.monotonic() - start


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
        if run.carried_caches:
            verdict = "caches carried, not judged"
        warm = "" if run.cold_page_cache else " (page cache warm: not root)"
        lines.append(
            f"{run.label:<10} {run.wall_s:7.1f}s {goal:6.0f}s {anchor:7.0f}s"
            f" {run.wall_s / anchor:8.2f}×  {verdict}{warm}"
        )
    lines.append("statuses against the committed runs:")
    for run in runs:
        if run.compared_with is None:
            lines.append(f"    {run.label}: no committed run to compare with")
            continue
        checks = len(run.results.get("checks", [])) if run.results else 0
        same = "all unchanged" if not run.status_changes else "CHANGED"
        lines.append(f"    {run.label}: {checks} checks, {same} ({run.compared_with})")
        lines += [f"      {change}" for change in run.status_changes]
    lines.append("where the time went:")
    for run in runs:
        lines += _profile(run)
    judged = [run for run in runs if not run.carried_caches]
    changed = any(run.status_changes for run in runs)
    return lines, all(run.met for run in judged) and not changed


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
    parser.add_argument(
        "--expect",
        type=Path,
        default=Path("results"),
        metavar="DIR",
        help="the committed results to compare statuses with (default: results)",
    )
    parser.add_argument(
        "--compile-bytecode",
        action="store_true",
        help="first compile the suite's packages' bytecode as the image does (unchecked-hash)",
    )
    parser.add_argument(
        "--carried-caches",
        action="store_true",
        help="run each size once more with the compiler caches of its first run (not judged)",
    )
    args = parser.parse_args(args_in)
    if args.quick_runs < 0:
        parser.error(f"--quick-runs {args.quick_runs}: give 0 or more")
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="suite-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    counts, folders = bytecode(args.python)
    if args.compile_bytecode:
        seconds = compile_bytecode(args.python, folders)
        print(f"compiled the bytecode of {', '.join(folders)} in {seconds:.1f}s", flush=True)
        counts, _ = bytecode(args.python)
    facts = bytecode_line(counts)
    print(facts, flush=True)
    runs: list[Timed] = []
    for n in range(1, args.quick_runs + 1):
        runs.append(_run(f"quick #{n}", "quick", out / f"suite-{n}.quick.json", args.python, extra))
    if args.full:
        runs.append(_run("full", "full", out / "suite.json", args.python, extra))
    if not runs:
        parser.error("nothing to run: give --quick-runs 1 or more, or leave out --no-full")
    if args.carried_caches:
        for size in ("quick", "full"):
            first = next((run for run in runs if run.size == size), None)
            if first is not None:
                name = f"suite-carried.{size}.json" if size == "quick" else "suite-carried.json"
                runs.append(
                    _run(f"{size} warm", size, out / name, args.python, extra, first.caches)
                )
    folder = args.expect if args.expect.is_dir() else None
    runs = [_compared(run, folder) for run in runs]
    lines, met = report(runs)
    print("\n".join([*lines, facts]), flush=True)
    print(f"results and logs: {out}")
    if any(run.results is None for run in runs):
        return 2
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
