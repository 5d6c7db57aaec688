"""Benchmark: ``envbuilder doctor``'s file check against hashing every file one by one.

Over the distributions of one environment (``--site DIR``, default the running
interpreter's), interleaved ``--rounds`` times so that load hits every arm alike:

- anchor, *serial*: every ``RECORD`` file hashed one after another, as doctor
  did before (read whole, ``hashlib.sha256``);
- *first*: `record_check.check_files` with no stamp (parallel hashing);
- *stamped*: the same again with the stamp the first run wrote.

Each arm starts from a cold page cache where the kernel lets us drop it (root,
``/proc/sys/vm/drop_caches``); otherwise the run says the numbers are warm.
Targets: first ≤ 10 s and stamped ≤ 1 s (issue: doctor ≤ 10 s on a 17k-file
environment), first no slower than serial (the median of the rounds' ratios:
both arms of a round ran under the same load). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path

from envbuilder.lockfile.record_check import ExpectedFile, check_files, expected_files

__all__ = ["main"]

FIRST_TARGET_S = 10.0
STAMPED_TARGET_S = 1.0
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _drop_caches() -> bool:
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


def _serial(files: Sequence[ExpectedFile]) -> None:
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            hashlib.sha256(f.path.read_bytes()).digest()


def _timed(fn: Callable[[], object], cold: bool) -> float:
    if cold:
        _drop_caches()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _summary(name: str, runs: Sequence[float]) -> str:
    med = statistics.median(runs)
    return (
        f"{name:<8} median {med:7.2f} s  (min {min(runs):.2f}, max {max(runs):.2f}, n={len(runs)})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuilder.bench doctor")
    parser.add_argument("--site", type=Path, action="append", help="site-packages to check")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    paths = [str(p) for p in args.site] if args.site else sys.path
    files = expected_files(metadata.distributions(path=paths))
    size = sum(f.path.stat().st_size for f in files if f.path.exists())
    cold = _drop_caches()
    print(
        f"doctor bench: {len(files)} RECORD files, {size / 2**20:.0f} MiB, "
        f"{'cold page cache before each arm' if cold else 'WARM page cache (cannot drop it here)'}"
    )
    serial: list[float] = []
    first: list[float] = []
    stamped: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            stamp = Path(tmp) / f"stamp{i}.json"
            serial.append(_timed(lambda: _serial(files), cold))
            run = partial(check_files, files, stamp=stamp)
            first.append(_timed(run, cold))
            stamped.append(_timed(run, cold))
    for name, runs in (("serial", serial), ("first", first), ("stamped", stamped)):
        print(_summary(name, runs))
    # paired by round: both arms of a round ran under the same load
    ratios = [f / s for f, s in zip(first, serial, strict=True)]
    ratio = statistics.median(ratios)
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"first/serial ratio: median {ratio:.2f} (per round {rounds}; target <= 1.0)")
    missed = []
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
