"""The results of a run: the records in order, the file written atomically, the summary."""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.conformance import RESULTS_SCHEMA
from envbuilder.conformance._record import STATUSES, CheckResult, Status, matches
from envbuilder.conformance.groups import group_names

__all__ = [
    "SuiteResults",
    "check_line",
    "now",
    "order",
    "summarize",
    "unmatched_patterns",
    "write_atomic",
]


def unmatched_patterns(patterns: Sequence[str], results: SuiteResults) -> list[str]:
    """The patterns that selected none of the checks in ``results``."""
    names = [c.name for c in results.checks]
    return [p for p in patterns if p and not any(matches(n, [p]) for n in names)]


def now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a part.

    The suite runs inside images where envbuilder's own writer (`envbuilder.files`) is
    not importable, hence this copy; like that one it creates the file with mode 0666
    minus the umask (``mkstemp``'s 0600 would stick to the results file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_MARKS: Mapping[Status, str] = {
    "pass": "✓",
    "fail": "✕",
    "skip": "-",
    "error": "!",
    "timeout": "⏱",
    "invalid": "?",
}


@dataclass(frozen=True, kw_only=True)
class SuiteResults:
    """A results file (``envbuilder.results/2``, docs/contracts.md) as typed records."""

    suite_version: str
    combination: str | None
    lock_sha256: str | None
    started: str
    finished: str
    runner: Mapping[str, Any]
    checks: tuple[CheckResult, ...]
    schema: str = RESULTS_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "suite_version": self.suite_version,
            "combination": self.combination,
            "lock_sha256": self.lock_sha256,
            "started": self.started,
            "finished": self.finished,
            "runner": dict(self.runner),
            "checks": [c.to_json() for c in self.checks],
        }

    @property
    def failed_gates(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.gate and c.failed)

    @property
    def failed_direct_gates(self) -> tuple[CheckResult, ...]:
        """Failed gate checks that are not workaround checks: what makes the exit status 1."""
        return tuple(c for c in self.failed_gates if c.workaround is None)


def check_line(check: CheckResult) -> str:
    gate = "gate" if check.gate else "info"
    text = (
        f"  {_MARKS[check.status]} {check.status:<7} {gate} {check.name} ({check.duration_s:.1f}s)"
    )
    if check.status != "pass" and check.reason:
        text += f": {check.reason[:240]}"
    return text


def summarize(results: SuiteResults) -> str:
    """The closing summary: counts by status, gates, and every failed direct gate check with
    its workaround checks."""
    checks = results.checks
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    gates = [c for c in checks if c.gate]
    direct = [c for c in gates if c.workaround is None]
    failed = results.failed_direct_gates
    runner = results.runner
    gpus = runner.get("gpus") or []
    gpu_text = ", ".join(f"{g['name']} (sm {g['compute_capability']})" for g in gpus) or "no GPU"
    lines = [
        f"conformance {results.suite_version} — {results.combination or 'current environment'}",
        f"  runner: torch {runner.get('torch')} (CUDA {runner.get('torch_cuda')}), xformers "
        f"{runner.get('xformers')}, {gpu_text}, driver {runner.get('driver')}",
        f"  {len(checks)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items()),
        f"  direct gates: {len(direct)} ({sum(1 for c in direct if c.status == 'pass')} pass, "
        f"{len(failed)} fail/error/timeout/invalid,"
        f" {sum(1 for c in direct if c.status == 'skip')} skip);"
        f" workaround checks: {len(gates) - len(direct)}"
        f" ({sum(1 for c in gates if c.workaround and c.status == 'pass')} pass)",
    ]
    covering: dict[str, list[CheckResult]] = {}
    for check in gates:
        if check.covers is not None:
            covering.setdefault(check.covers, []).append(check)
    for check in failed:
        lines.append(check_line(check))
        for workaround in covering.get(check.name, []):
            lines.append("    " + check_line(workaround).strip())
    return "\n".join(lines)


def order(
    records: Sequence[Mapping[str, Any]], positions: Mapping[str, int] | None = None
) -> list[CheckResult]:
    """The checks of a JSONL stream, first record per name, in group order; within a group
    in plan order (``positions``: a check's place in its group's plan; a workaround check
    follows the check it covers), else in stream order."""
    seen: set[str] = set()
    checks: list[CheckResult] = []
    for record in records:
        name = str(record.get("name"))
        if name not in seen:
            seen.add(name)
            checks.append(CheckResult.from_json(record))
    rank = {group: i for i, group in enumerate(group_names())}
    places = positions or {}
    unplaced = len(checks)  # after every planned check, in stream order

    def key(item: tuple[int, CheckResult]) -> tuple[int, int, int, int]:
        index, check = item
        group = rank.get(check.group, len(rank))
        place = places.get(check.name)
        if place is not None:
            return group, place, 0, index
        covered = places.get(check.covers) if check.covers is not None else None
        if covered is not None:
            return group, covered, 1, index
        return group, unplaced, 2, index

    return [check for _, check in sorted(enumerate(checks), key=key)]
