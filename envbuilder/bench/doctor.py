"""Benchmark: ``envbuilder doctor`` as a start-up check, against ``python -m xformers.info``.

    python -m envbuilder.bench doctor [--python PY] [--lock FILE] [--rounds N]
    python -m envbuilder.bench doctor files [--site DIR] ...   (the file check, `_doctor_files`)

Each round, in the environment of ``--python`` (default: the running interpreter),
every arm a fresh process timed from its start to its exit:

- *anchor cold*: ``python -m xformers.info`` (imports torch and xformers, asks CUDA
  for the GPU) after dropping the page cache;
- *first*: ``envbuilder doctor`` with an empty ``--cache-dir`` (no file stamp, no
  record of the GPU checks, empty compile caches), after dropping the page cache;
- *anchor warm*: ``python -m xformers.info`` again;
- *warm*: ``envbuilder doctor`` again with the same directory;
- *import*: ``python -c "import torch, xformers.ops"``;
- *fast*: ``envbuilder doctor --fast`` with the same directory.

Goals (issue 37), each the median over rounds of the ratio within a round (both arms
of a ratio ran under the same load): first ≤ 2 × anchor cold, warm ≤ 1.25 × anchor
warm, fast ≤ 1 × import. Where the page cache cannot be dropped (not root) the run
says so. Exit status 1 when a goal is missed, 2 when an arm could not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuilder.bench._cold import drop_caches

__all__ = ["GOALS", "Ratio", "main", "ratios"]

#: arm -> (its anchor, the most it may cost as a multiple of that anchor)
GOALS: Mapping[str, tuple[str, float]] = {
    "first": ("anchor cold", 2.0),
    "warm": ("anchor warm", 1.25),
    "fast": ("import", 1.0),
}
ARMS = ("anchor cold", "first", "anchor warm", "warm", "import", "fast")
IMPORT = "import torch, xformers.ops"
ALLOWED_STATUS: Mapping[str, frozenset[int]] = {
    name: frozenset({0, 1} if name in GOALS else {0}) for name in ARMS
}


@dataclass(frozen=True, kw_only=True)
class Arm:
    name: str
    seconds: float
    status: int
    output: str


@dataclass(frozen=True, kw_only=True)
class Ratio:
    arm: str
    anchor: str
    goal: float
    per_round: tuple[float, ...]
    seconds: tuple[float, ...] = field(default=())
    anchor_seconds: tuple[float, ...] = field(default=())

    @property
    def median(self) -> float:
        return statistics.median(self.per_round)

    @property
    def met(self) -> bool:
        return self.median <= self.goal


def ratios(rounds: Sequence[Mapping[str, float]]) -> list[Ratio]:
    """Each goal's ratio per round (arm ÷ its anchor in the same round)."""
    out = []
    for arm, (anchor, goal) in GOALS.items():
        seconds = tuple(r[arm] for r in rounds)
        anchors = tuple(r[anchor] for r in rounds)
        out.append(
            Ratio(
                arm=arm,
                anchor=anchor,
                goal=goal,
                per_round=tuple(s / a for s, a in zip(seconds, anchors, strict=True)),
                seconds=seconds,
                anchor_seconds=anchors,
            )
        )
    return out


def table(found: Sequence[Ratio]) -> list[str]:
    """The runs beside their anchors, one line per goal, and the verdict."""
    lines = [f"{'run':<6} {'median':>8}   {'anchor':<12} {'median':>8} {'ratio':>7} {'goal':>6}"]
    for r in found:
        verdict = "met" if r.met else "MISSED"
        lines.append(
            f"{r.arm:<6} {statistics.median(r.seconds):7.2f}s   {r.anchor:<12}"
            f" {statistics.median(r.anchor_seconds):7.2f}s {r.median:6.2f}× {r.goal:5.2f}×"
            f"  {verdict}  (per round {', '.join(f'{x:.2f}' for x in r.per_round)})"
        )
    return lines


def _timed(name: str, command: Sequence[str], *, cold: bool) -> Arm:
    if cold:
        drop_caches()
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    return Arm(name=name, seconds=seconds, status=proc.returncode, output=proc.stdout + proc.stderr)


def _doctor(python: str, lock: Path | None, cache: Path, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "envbuilder", "doctor", "--python", python]
    command += ["--cache-dir", str(cache), "--json", *extra]
    return command + (["--lock", str(lock)] if lock is not None else [])


def _findings(arm: Arm) -> str:
    """The doctor's findings, one short line each (its ``--json`` output)."""
    try:
        start = arm.output.index("{")
        report: dict[str, Any] = json.JSONDecoder().raw_decode(arm.output[start:])[0]
    except ValueError:
        return "      (no JSON: " + " / ".join(arm.output.strip().splitlines()[-3:]) + ")"
    lines = [f"      {f['status']:<4} {f['name']}: {f['detail'][:160]}" for f in report["findings"]]
    return "\n".join([*lines, *_probe_times(report.get("probe") or {})])


def _probe_times(probe: Mapping[str, Any]) -> list[str]:
    """Where the probe's time went: each probe process, and the smoke test's phases."""
    out = []
    if probe.get("probe_seconds"):
        out.append(_seconds("probes", probe["probe_seconds"]))
    if probe.get("seconds"):
        out.append(_seconds("smoke test", probe["seconds"]))
    return out


def _seconds(what: str, seconds: Mapping[str, float]) -> str:
    return f"      time, {what}: " + ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items())


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["files"]:
        from envbuilder.bench import _doctor_files

        return _doctor_files.main(args_in[1:])
    parser = argparse.ArgumentParser(prog="python -m envbuilder.bench doctor")
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    parser.add_argument("--lock", type=Path, help="the lockfile (default: as doctor chooses)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(args_in)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    cold = drop_caches()
    print(
        f"doctor bench: {args.python}, {args.rounds} rounds, "
        f"{'cold page cache before anchor cold and first' if cold else 'WARM page cache (cannot drop it here)'}",
        flush=True,
    )
    info = [args.python, "-m", "xformers.info"]
    rounds: list[dict[str, float]] = []
    failed = []
    last: dict[str, Arm] = {}
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as tmp:
        for n in range(args.rounds):
            cache = Path(tmp) / f"round{n}"
            commands = {
                "anchor cold": info,
                "first": _doctor(args.python, args.lock, cache),
                "anchor warm": info,
                "warm": _doctor(args.python, args.lock, cache),
                "import": [args.python, "-c", IMPORT],
                "fast": _doctor(args.python, args.lock, cache, "--fast"),
            }
            arms = {
                name: _timed(name, commands[name], cold=cold and name in ("anchor cold", "first"))
                for name in ARMS
            }
            rounds.append({name: arm.seconds for name, arm in arms.items()})
            print(
                f"round {n + 1}: "
                + ", ".join(f"{name} {arm.seconds:.2f}s" for name, arm in arms.items()),
                flush=True,
            )
            # the doctor exits 1 on a failed finding: the bench times it all the same
            failed += [a for a in arms.values() if a.status not in ALLOWED_STATUS[a.name]]
            last = arms
    for name in ("first", "warm", "fast"):
        print(f"    {name} (last round, exit {last[name].status}):")
        print(_findings(last[name]))
    found = ratios(rounds)
    print("\n".join(table(found)))
    for arm in failed:
        tail = " / ".join(arm.output.strip().splitlines()[-3:])
        print(f"✕ {arm.name} exited with status {arm.status}: {tail}")
    missed = [r for r in found if not r.met]
    for r in missed:
        print(f"✕ goal missed: {r.arm} {r.median:.2f}× {r.anchor} > {r.goal}×")
    if failed:
        return 2
    if not missed:
        print("✓ every goal met")
    return 1 if missed else 0
