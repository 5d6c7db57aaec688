"""The check records ``repro`` and ``report`` work from, read from a lockfile or results files.

A consumer has no ``results/`` directory: the check records travel with the
compatibility lockfile (each run's checks with their name, status, reason and
numbers, and the runner's facts), so `from_lockfile` is the default source;
`from_results` reads an ``envbuilder.results/1``, ``/2`` or ``/3`` file for maintainers.
Both give the same records: a `RecordedRun` per run, each `Recorded` check nesting
the facts of its run.

Who is at fault (`Recorded.fault`) is an experiment's finding: ``fault_component``
counts only with the ``fault_evidence`` that decided it; a component a suite
before 3.0 read from an error message is ``undecided``. A check whose error the
suite's own code raised is the suite's (`Recorded.suite_error`).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from envbuilder import jsondoc
from envbuilder.conformance._record import (
    FAILED,
    READABLE_RESULTS_SCHEMAS,
    STATUSES,
    Status,
    decided_fault,
    is_suite_error,
)
from envbuilder.errors import InputError
from envbuilder.lockfile.model import CompatLock

__all__ = [
    "RESULTS_SCHEMAS",
    "Recorded",
    "RecordedRun",
    "RunFacts",
    "choose",
    "from_lockfile",
    "from_results",
    "of_combination",
    "results_in",
]

RESULTS_SCHEMAS = READABLE_RESULTS_SCHEMAS


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """Where and on what a run was measured."""

    source: str  # the results file (as the lockfile names it, or its path)
    combination: str | None
    suite_version: str | None
    finished: str | None
    runner: Mapping[str, Any]

    def version(self, package: str) -> str | None:
        """``torch``, ``xformers``, ``python``, ``driver``, ``torch_cuda`` as the runner
        recorded them; None where it did not."""
        value = self.runner.get(package)
        return str(value) if value not in (None, "") else None

    @property
    def gpu(self) -> str | None:
        gpus = self.runner.get("gpus")
        if isinstance(gpus, Sequence) and gpus and isinstance(gpus[0], Mapping):
            return str(gpus[0].get("name") or "a GPU")
        return None


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """One check as its run recorded it."""

    run: RunFacts
    name: str
    status: Status | None  # None: a status the suite does not make
    reason: str
    numbers: Mapping[str, Any]
    workaround: str | None = None
    covers: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def cause(self) -> str:
        """The suite's ``cause`` (one line shared by checks failing for one reason), else the
        reason's first clause."""
        cause = self.numbers.get("cause")
        if isinstance(cause, str) and cause:
            return cause
        return self.reason.split(" | ")[0].strip()[:160] or "no reason recorded"

    @property
    def suite_error(self) -> bool:
        """An error the suite's own code raised: ``fault_component`` ``suite``, or (in results
        of a suite that did not decide it) an error whose innermost frame, as the worker
        recorded it (``… (at checks_model.py:193)``), is a file of the suite."""
        if self.status is None:
            return False
        if is_suite_error(self.status, self.numbers):
            return True
        if self.status != "error" or "fault_component" in self.numbers:
            return False
        found = _WORKER_FRAME.search(self.reason)
        return found is not None and found.group(1) in _suite_files()

    @property
    def fault(self) -> str:
        """``suite``, the component an experiment decided (with its evidence), or ``undecided``."""
        return "suite" if self.suite_error else decided_fault(self.numbers)[0]

    @property
    def fault_evidence(self) -> str | None:
        return decided_fault(self.numbers)[1]

    def number(self, key: str) -> float | None:
        """The number ``key`` as a float; None where it is not one (or too large for one)."""
        value = self.numbers.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                return None
        return None


#: how the worker ends the reason of an exception a check raised: its innermost frame
_WORKER_FRAME = re.compile(r"\(at ([\w.]+\.py):\d+\)\s*$")


@cache
def _suite_files() -> frozenset[str]:
    package = resources.files("envbuilder.conformance")
    return frozenset(p.name for p in package.iterdir() if p.name.endswith(".py"))


@dataclass(frozen=True, kw_only=True)
class RecordedRun:
    """One run's facts and its checks."""

    facts: RunFacts
    checks: tuple[Recorded, ...]

    def named(self, name: str) -> Recorded | None:
        return next((c for c in self.checks if c.name == name), None)

    def covering(self, name: str) -> list[Recorded]:
        """The workaround checks that re-ran check ``name``'s case."""
        return [c for c in self.checks if c.covers == name]


def _encodable(value: Any) -> Any:
    """``value`` with every string's lone surrogates (JSON's ``"\\ud800"``) written as
    ``\\ud800``: text that no UTF-8 file or terminal can take would end a command in a
    traceback. Other characters stay; where they are shown they are escaped there."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, Mapping):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


def _status(value: object) -> Status | None:
    return next((s for s in STATUSES if s == value), None)


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def _run(facts: RunFacts, checks: Iterable[Mapping[str, Any]]) -> RecordedRun:
    facts = RunFacts(
        source=_encodable(facts.source),
        combination=_encodable(facts.combination),
        suite_version=_encodable(facts.suite_version),
        finished=_encodable(facts.finished),
        runner=_encodable(facts.runner),
    )
    records = []
    for check in map(_encodable, checks):
        numbers = check.get("numbers")
        records.append(
            Recorded(
                run=facts,
                name=str(check.get("name")),
                status=_status(check.get("status")),
                reason=str(check.get("reason") or ""),
                numbers=numbers if isinstance(numbers, Mapping) else {},
                workaround=_text(check.get("workaround")),
                covers=_text(check.get("covers")),
            )
        )
    return RecordedRun(facts=facts, checks=tuple(records))


def from_lockfile(lock: CompatLock) -> list[RecordedRun]:
    """Every run on a combination's current lock, as the lockfile carries it."""
    runs = []
    for entry in lock.combinations:
        for run in entry.runs:
            facts = RunFacts(
                source=run.source,
                combination=entry.id,
                suite_version=run.suite_version,
                finished=run.finished,
                runner=run.runner,
            )
            checks = [
                {
                    "name": c.name,
                    "status": c.status,
                    "reason": c.reason,
                    "numbers": c.numbers,
                    "workaround": c.workaround,
                    "covers": c.covers,
                }
                for c in run.checks
            ]
            runs.append(_run(facts, checks))
    return runs


def from_results(path: Path) -> RecordedRun:
    """A results file's run, or an `InputError` saying what is wrong with the file."""
    try:
        data = jsondoc.parse(path.read_bytes())
    except FileNotFoundError as e:
        raise InputError(f"--results {str(path)!r}: no such file") from e
    except OSError as e:
        raise InputError(f"--results {str(path)!r}: cannot be read ({e.strerror or e})") from e
    except jsondoc.NotJSON as e:
        raise InputError(f"--results {str(path)!r}: not a readable JSON file: {e}") from e
    if not isinstance(data, dict) or data.get("schema") not in RESULTS_SCHEMAS:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(
            f"{str(path)!r} is not a conformance results file (schema {found!r}; expected "
            f"one of {', '.join(RESULTS_SCHEMAS)}): give the JSON the suite wrote with --out"
        )
    runner = data.get("runner")
    facts = RunFacts(
        source=str(path),
        combination=_text(data.get("combination")),
        suite_version=_text(data.get("suite_version")),
        finished=_text(data.get("finished") or data.get("started")),
        runner=runner if isinstance(runner, Mapping) else {},
    )
    checks = data.get("checks")
    return _run(facts, [c for c in checks or () if isinstance(c, Mapping)])


def results_in(path: Path) -> list[RecordedRun]:
    """The results file ``path``, or every results file directly in the directory ``path``
    (other JSON files there are passed over)."""
    if not path.is_dir():
        return [from_results(path)]
    found = []
    for file in sorted(path.glob("*.json")):
        try:
            found.append(from_results(file))
        except InputError:
            continue
    if not found:
        raise InputError(f"no conformance results files in {str(path)!r}")
    return found


def _matching(run: RecordedRun, pattern: str) -> list[Recorded]:
    if any(ch in pattern for ch in "*?["):
        return [c for c in run.checks if fnmatch.fnmatchcase(c.name, pattern)]
    return [c for c in run.checks if c.name == pattern]


def _standing(found: list[Recorded]) -> int:
    """2 where a matching check failed, 1 where one ran and passed, 0 where all were skipped."""
    if any(c.failed for c in found):
        return 2
    return 1 if any(c.status == "pass" for c in found) else 0


def of_combination(runs: Sequence[RecordedRun], combination: str) -> list[RecordedRun]:
    """The runs of ``combination``, or an `InputError` with the nearest ids there are."""
    mine = [r for r in runs if r.facts.combination == combination]
    if not mine:
        known = sorted({str(r.facts.combination) for r in runs})
        near = difflib.get_close_matches(combination, known, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
        raise InputError(f"no runs of combination {combination!r} here{hint}")
    return mine


def choose(runs: Sequence[RecordedRun], pattern: str, combination: str | None = None) -> Recorded:
    """The check ``pattern`` names (exactly, or a glob matching one), from the newest run
    (of ``combination`` when given) where it failed, else where it passed, else any."""
    if combination is not None:
        runs = of_combination(runs, combination)
    holding = [(r, _matching(r, pattern)) for r in runs]
    holding = [(r, found) for r, found in holding if found]
    if not holding:
        names = sorted({c.name for r in runs for c in r.checks})
        near = difflib.get_close_matches(pattern, names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
        raise InputError(f"no check {pattern!r} in {len(runs)} run(s){hint}")
    run, found = max(
        holding, key=lambda rf: (_standing(rf[1]), rf[0].facts.finished or "", len(rf[0].checks))
    )
    if len(found) > 1:
        listed = ", ".join(c.name for c in found[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        raise InputError(
            f"{pattern!r} matches {len(found)} checks in {run.facts.source}: {listed}{more}; "
            "name one check (a glob must match exactly one)"
        )
    return found[0]
