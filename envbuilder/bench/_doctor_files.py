"""Benchmark: ``envbuilder doctor``'s file check, against hashing each file in turn.

    python -m envbuilder.bench doctor files [--site DIR] [--python PY] [--rounds N]

Over the distributions of one environment (``--site DIR``, default the running
interpreter's) and its interpreter (``--python``, default the running one),
interleaved ``--rounds`` times so that load hits every arm alike:

- anchor, *serial*: every ``RECORD`` file hashed one after another (read
  whole, ``hashlib.sha256``);
- *first*: `record_check.check_files` with no stamp (parallel hashing);
- *stamped*: the same again with the stamp the first run wrote;
- anchor, *doctor before*: the full probe (importing torch and xformers, as
  the doctor did on every host) and then the file check with no stamp;
- *doctor first*: what a first ``doctor`` run does now: `start_probe` (the
  light probe where no GPU is present, the full one where one is) beside the
  file check with no stamp.

Each arm starts from a cold page cache where the kernel lets us drop it (root,
``/proc/sys/vm/drop_caches``); otherwise the run says the numbers are warm.
Targets: doctor first ≤ 5 s (issue 27), first ≤ 10 s, stamped ≤ 1 s, first no
slower than serial (the median of the rounds' ratios: both arms of a round ran
under the same load). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path

from envbuilder.bench._cold import drop_caches
from envbuilder.consumer.doctor import run_probe, start_probe
from envbuilder.consumer.record_check import ExpectedFile, check_files, expected_files

__all__ = ["main"]

DOCTOR_FIRST_TARGET_S = 5.0
FIRST_TARGET_S = 10.0
STAMPED_TARGET_S = 1.0


def _serial(files: Sequence[ExpectedFile]) -> None:
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            hashlib.sha256(f.path.read_bytes()).digest()


def _doctor_before(files: Sequence[ExpectedFile], python: str, stamp: Path) -> None:
    run_probe(python)
    check_files(files, stamp=stamp)


def _doctor_first(files: Sequence[ExpectedFile], python: str, stamp: Path) -> None:
    running = start_probe(python)
    check_files(files, stamp=stamp)
    running.report()


def _timed(fn: Callable[[], object], cold: bool) -> float:
    if cold:
        drop_caches()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _summary(name: str, runs: Sequence[float]) -> str:
    med = statistics.median(runs)
    spread = f"(min {min(runs):.2f}, max {max(runs):.2f}, n={len(runs)})"
    return f"{name:<40} median {med:7.2f} s  {spread}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuilder.bench doctor files")
    parser.add_argument("--site", type=Path, action="append", help="site-packages to check")
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    paths = [str(p) for p in args.site] if args.site else sys.path
    files = expected_files(metadata.distributions(path=paths))
    size = sum(f.path.stat().st_size for f in files if f.path.exists())
    cold = drop_caches()
    print(
        f"doctor bench: {len(files)} RECORD files, {size / 2**20:.0f} MiB, "
        f"{'cold page cache before each arm' if cold else 'WARM page cache (cannot drop it here)'}"
    )
    serial: list[float] = []
    first: list[float] = []
    stamped: list[float] = []
    before: list[float] = []
    doctor: list[float] = []
    probe = start_probe(args.python).report()
    print(f"probe of {args.python}: {'light' if probe.get('light') else 'full'}: {probe}")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            stamp = Path(tmp) / f"stamp{i}.json"
            serial.append(_timed(lambda: _serial(files), cold))
            run = partial(check_files, files, stamp=stamp)
            first.append(_timed(run, cold))
            stamped.append(_timed(run, cold))
            stamp = Path(tmp) / f"before{i}.json"
            before.append(_timed(partial(_doctor_before, files, args.python, stamp), cold))
            stamp = Path(tmp) / f"doctor{i}.json"
            doctor.append(_timed(partial(_doctor_first, files, args.python, stamp), cold))
    arms = [("serial", serial), ("first", first), ("stamped", stamped)]
    arms += [("doctor before (full probe, then files)", before), ("doctor first", doctor)]
    for name, runs in arms:
        print(_summary(name, runs))
    paired = [d / b for d, b in zip(doctor, before, strict=True)]
    print(
        f"doctor first / doctor before: median {statistics.median(paired):.2f} "
        f"(per round {', '.join(f'{r:.2f}' for r in paired)})"
    )
    # paired by round: both arms of a round ran under the same load
    ratios = [f / s for f, s in zip(first, serial, strict=True)]
    ratio = statistics.median(ratios)
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"first/serial ratio: median {ratio:.2f} (per round {rounds}; target <= 1.0)")
    missed = []
    if statistics.median(doctor) > DOCTOR_FIRST_TARGET_S:
        missed.append(
            f"doctor first run {statistics.median(doctor):.1f} s > {DOCTOR_FIRST_TARGET_S} s"
        )
    if statistics.median(first) > FIRST_TARGET_S:
        missed.append(f"first run {statistics.median(first):.1f} s > {FIRST_TARGET_S} s")
    if statistics.median(stamped) > STAMPED_TARGET_S:
        missed.append(f"stamped run {statistics.median(stamped):.1f} s > {STAMPED_TARGET_S} s")
    if ratio > 1.0:
        missed.append(f"first run slower than serial hashing ({ratio:.2f}x)")
    for m in missed:
        print(f"✕ target missed: {m}")
    if not missed:
        print("✓ every target met")
    return 1 if missed else 0
