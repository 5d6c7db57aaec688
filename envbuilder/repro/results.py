"""Which results file and which check a ``envbuilder repro`` call means.

Results files are the suite's ``envbuilder.results/2`` documents (docs/contracts.md).
The check is named exactly or by a glob that matches one check; without ``--results``
the newest file (by its ``finished`` time) where that check failed is used, else the newest
where it passed, else the newest that holds it (skipped).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuilder import jsondoc
from envbuilder.conformance._record import FAILED, STATUSES, Status
from envbuilder.errors import InputError

__all__ = ["Recorded", "ResultsFile", "choose", "load", "results_in"]

SCHEMAS = ("envbuilder.results/1", "envbuilder.results/2")


@dataclass(frozen=True, kw_only=True)
class ResultsFile:
    """One results document and where it was read from."""

    path: Path
    data: Mapping[str, Any]

    @property
    def checks(self) -> list[Mapping[str, Any]]:
        return [c for c in self.data.get("checks", []) if isinstance(c, Mapping)]

    @property
    def names(self) -> list[str]:
        return [str(c.get("name")) for c in self.checks]

    @property
    def finished(self) -> str:
        return str(self.data.get("finished") or self.data.get("started") or "")


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """One check as a results file recorded it, with the facts of the run."""

    results: ResultsFile
    check: Mapping[str, Any]
    runner: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.check["name"])

    @property
    def status(self) -> Status | None:
        """The check's status; None for one the suite does not make (or none at all)."""
        value = self.check.get("status")
        return next((s for s in STATUSES if s == value), None)

    @property
    def reason(self) -> str:
        return str(self.check.get("reason") or "")

    @property
    def numbers(self) -> Mapping[str, Any]:
        numbers = self.check.get("numbers")
        return numbers if isinstance(numbers, Mapping) else {}

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def cuda(self) -> bool:
        """Whether the suite ran on a GPU: it takes cuda:0 whenever one is visible."""
        return bool(self.runner.get("gpus"))

    @property
    def quick_file(self) -> bool:
        return ".quick." in self.results.path.name

    def fact(self, key: str) -> str | None:
        """``cause``, ``fault_component``, ``fault_op``: from the check or its numbers."""
        value = self.check.get(key, self.numbers.get(key))
        return None if value in (None, "") else str(value)


def load(path: Path) -> ResultsFile:
    """A results file, or an `InputError` saying what is wrong with it."""
    try:
        data = jsondoc.parse(path.read_bytes())
    except FileNotFoundError as e:
        raise InputError(f"--results {str(path)!r}: no such file") from e
    except OSError as e:
        raise InputError(f"--results {str(path)!r}: cannot be read ({e.strerror or e})") from e
    except jsondoc.NotJSON as e:
        raise InputError(f"--results {str(path)!r}: not a readable JSON file: {e}") from e
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(
            f"{str(path)!r} is not a conformance results file (schema {found!r}; "
            f"expected one of {', '.join(SCHEMAS)}): give the JSON the suite wrote with --out"
        )
    return ResultsFile(path=path, data=data)


def results_in(directory: Path) -> list[ResultsFile]:
    """Every results file directly under ``directory`` (other JSON files are passed over)."""
    if not directory.is_dir():
        raise InputError(
            f"no {str(directory)!r} directory here to look for results in: run from the "
            "checkout that holds results/, or give --results FILE"
        )
    found: list[ResultsFile] = []
    for path in sorted(directory.glob("*.json")):
        try:
            found.append(load(path))
        except InputError:
            continue
    if not found:
        raise InputError(f"no conformance results files in {str(directory)!r}; give --results")
    return found


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _matching(results: ResultsFile, pattern: str) -> list[Mapping[str, Any]]:
    if _is_glob(pattern):
        return [c for c in results.checks if fnmatch.fnmatchcase(str(c.get("name")), pattern)]
    return [c for c in results.checks if c.get("name") == pattern]


def _standing(results: ResultsFile, pattern: str) -> int:
    """2 where a matching check failed, 1 where one ran and passed, 0 where all were skipped:
    a file where xformers was not even installed holds the name but nothing to reproduce."""
    statuses = {str(c.get("status")) for c in _matching(results, pattern)}
    if statuses & {"fail", "error", "timeout", "invalid"}:
        return 2
    return 1 if "pass" in statuses else 0


def choose(files: Sequence[ResultsFile], pattern: str) -> Recorded:
    """The check ``pattern`` names, from the newest of ``files`` where it failed (else the
    newest where it passed, else the newest that holds it at all).

    Unknown: an `InputError` with the closest names present (difflib). A glob matching
    several checks of that file: an `InputError` listing them.
    """
    holding = [f for f in files if _matching(f, pattern)]
    if not holding:
        names = sorted({n for f in files for n in f.names})
        near = difflib.get_close_matches(pattern, names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        where = str(files[0].path) if len(files) == 1 else f"{len(files)} results files"
        raise InputError(f"no check {pattern!r} in {where}{hint}")
    newest = max(holding, key=lambda f: (_standing(f, pattern), f.finished, f.path.name))
    matched = _matching(newest, pattern)
    if len(matched) > 1:
        listed = ", ".join(str(c.get("name")) for c in matched[:8])
        more = f" and {len(matched) - 8} more" if len(matched) > 8 else ""
        raise InputError(
            f"{pattern!r} matches {len(matched)} checks in {newest.path}: {listed}{more}; "
            "name one check (a glob must match exactly one)"
        )
    runner = newest.data.get("runner")
    return Recorded(
        results=newest, check=matched[0], runner=runner if isinstance(runner, Mapping) else {}
    )
