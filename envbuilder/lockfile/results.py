"""Reading conformance results files (``envbuilder.results/1``) for the lockfile.

A results file is *rejected* (never merged) when it is not JSON, fails the
results JSON Schema, comes from a newer results schema or a newer suite major
version than this envbuilder understands, names no combination or one the
resolution does not have, or carries a ``lock_sha256`` other than the
combination's current one (the lock changed since it ran: re-run the suite)
or none at all for a resolved combination (the run is not tied to its lock).
A run for an *unsatisfiable* combination carries no lock hash and is kept as
evidence for the resolver's reason; the verdict stays ``unsatisfiable``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from envbuilder.lockfile.canonical import finite
from envbuilder.lockfile.model import CheckOutcome, RejectedResults, Run
from envbuilder.lockfile.verdicts import run_verdict
from envbuilder.model import ResolvedCombination

__all__ = [
    "RESULTS_SCHEMA",
    "SUPPORTED_SUITE_MAJOR",
    "Rejected",
    "ResultsFile",
    "accept",
    "find_results",
    "read_results",
    "rejection_record",
]

RESULTS_SCHEMA = "envbuilder.results/1"
SUPPORTED_SUITE_MAJOR = 1

_STATUS = ["pass", "fail", "skip", "error", "timeout"]
_SCALAR: dict[str, Any] = {"type": ["number", "string", "boolean", "null"]}

#: The shape documented in docs/contracts.md; used only while the conformance
#: stage's ``envbuilder/schemas/results.schema.json`` does not exist.
_DOCUMENTED_SHAPE: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "schema",
        "suite_version",
        "combination",
        "lock_sha256",
        "started",
        "finished",
        "runner",
        "checks",
    ],
    "properties": {
        "schema": {"const": RESULTS_SCHEMA},
        "suite_version": {"type": "string"},
        "combination": {"type": ["string", "null"]},
        "lock_sha256": {"type": ["string", "null"]},
        "started": {"type": "string"},
        "finished": {"type": "string"},
        "runner": {
            "type": "object",
            "required": ["hostname", "platform", "python", "torch", "gpus"],
            "properties": {
                "gpus": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "compute_capability"],
                        "properties": {
                            "index": {"type": "integer"},
                            "name": {"type": "string"},
                            "compute_capability": {"type": "string"},
                            "memory_mib": {"type": ["integer", "null"]},
                        },
                    },
                }
            },
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["group", "name", "status", "gate"],
                "properties": {
                    "group": {"type": "string"},
                    "name": {"type": "string"},
                    "status": {"enum": _STATUS},
                    "reason": {"type": "string"},
                    "gate": {"type": "boolean"},
                    "impl": {"enum": ["xformers", "sdpa", None]},
                    "workaround": {"type": ["string", "null"]},
                    "numbers": {"type": "object", "additionalProperties": _SCALAR},
                    "duration_s": {"type": ["number", "null"]},
                },
            },
        },
    },
}


class Rejected(Exception):
    """A results file that must not be merged; ``str()`` names the file and why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class ResultsFile:
    path: Path
    sha256: str
    data: Mapping[str, Any]

    @property
    def combination(self) -> str:
        return str(self.data["combination"])


@cache
def _schema() -> Mapping[str, Any]:
    packaged = resources.files("envbuilder").joinpath("schemas/results.schema.json")
    if packaged.is_file():
        loaded: Mapping[str, Any] = json.loads(packaged.read_text(encoding="utf-8"))
        return loaded
    return _DOCUMENTED_SHAPE


def _major(version: object) -> int | None:
    if not isinstance(version, str):
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def read_results(path: Path) -> ResultsFile:
    """Read and validate one results file, raising `Rejected` with the reason."""
    import jsonschema

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise Rejected(path, f"cannot be read ({e.strerror})") from e
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Rejected(path, f"not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise Rejected(path, "not a results file (the top level is not an object)")
    schema = data.get("schema")
    if schema != RESULTS_SCHEMA:
        if isinstance(schema, str) and schema.startswith("envbuilder.results/"):
            raise Rejected(
                path,
                f"results schema {schema!r} is not {RESULTS_SCHEMA!r}; "
                "upgrade envbuilder to merge results from a newer suite",
            )
        raise Rejected(path, f"not an envbuilder results file (schema = {schema!r})")
    major = _major(data.get("suite_version"))
    if major is not None and major > SUPPORTED_SUITE_MAJOR:
        raise Rejected(
            path,
            f"from a newer conformance suite (suite_version {data['suite_version']!r}; "
            f"this envbuilder merges suite {SUPPORTED_SUITE_MAJOR}.x): upgrade envbuilder",
        )
    errors = sorted(
        jsonschema.Draft202012Validator(_schema()).iter_errors(data), key=lambda e: list(e.path)
    )
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise Rejected(path, f"fails the results schema at {where}: {first.message}{more}")
    names = [c["name"] for c in data["checks"]]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise Rejected(path, f"check names are not unique: {', '.join(map(repr, duplicates))}")
    return ResultsFile(path=path, sha256=hashlib.sha256(raw).hexdigest(), data=data)


def find_results(paths: Iterable[Path]) -> list[Path]:
    """Expand directories to the ``*.json`` files below them, sorted; keep files as given."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.json") if p.is_file())
        else:
            found.append(path)
    return found


def _relative(path: Path, base: Path) -> str:
    try:
        return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()
    except ValueError:  # another drive
        return path.name


def _run(results: ResultsFile, combo: ResolvedCombination, base: Path) -> Run:
    data = finite(results.data)
    checks = tuple(
        sorted((CheckOutcome.from_json(c) for c in data["checks"]), key=lambda c: c.name)
    )
    gpus = data["runner"].get("gpus") or []
    first = gpus[0] if gpus else None
    return Run(
        source=_relative(results.path, base),
        source_sha256=results.sha256,
        suite_version=data["suite_version"],
        started=data["started"],
        finished=data["finished"],
        gpu=first["name"] if first else "cpu",
        compute_capability=first["compute_capability"] if first else None,
        runner=data["runner"],
        checks=checks,
        verdict=run_verdict(checks, combo.extra_runtime),
    )


def rejection_record(rejected: Rejected, base: Path) -> RejectedResults:
    """How the lockfile lists a rejected file (with ``--skip-rejected``)."""
    return RejectedResults(file=_relative(rejected.path, base), reason=rejected.reason)


def accept(
    files: Sequence[Path], combinations: Mapping[str, ResolvedCombination], *, base: Path
) -> tuple[dict[str, list[Run]], list[Rejected]]:
    """Read every file; return accepted runs per combination id and the rejections.

    ``base`` is the lockfile's directory: run sources are recorded relative to
    it. Byte-identical files are merged once.
    """
    runs: dict[str, list[Run]] = {}
    rejected: list[Rejected] = []
    seen: set[str] = set()
    for path in files:
        try:
            results = read_results(path)
            combo_id = results.data["combination"]
            if combo_id is None:
                raise Rejected(path, "names no combination (combination = null)")
            combo = combinations.get(combo_id)
            if combo is None:
                raise Rejected(path, f"combination {combo_id!r} is not in the resolution")
            if combo.status == "unsatisfiable":
                # Evidence for the resolver's reason (e.g. the extension really fails to load);
                # there is no lock to bind to, and the verdict stays `unsatisfiable`.
                if results.data["lock_sha256"] is not None:
                    raise Rejected(
                        path,
                        f"combination {combo_id!r} is unsatisfiable and has no lock, but this run "
                        f"names lock_sha256 {results.data['lock_sha256']!r}",
                    )
            elif combo.status != "resolved":
                raise Rejected(path, f"combination {combo_id!r} is {combo.status}, not resolved")
            elif results.data["lock_sha256"] is None:
                raise Rejected(
                    path,
                    f"lock_sha256 is null: this run is not tied to the lock of {combo_id!r}; run the "
                    "suite through `envbuilder conformance` (in the combination's image, or "
                    "--in-place in an environment that is the combination), which records it",
                )
            elif results.data["lock_sha256"] != combo.lock_sha256:
                raise Rejected(
                    path,
                    f"lock_sha256 {results.data['lock_sha256']!r} is not the current lock of "
                    f"{combo_id!r} ({combo.lock_sha256!r}): the lock changed since this ran; "
                    "re-run the suite",
                )
        except Rejected as e:
            rejected.append(e)
            continue
        if results.sha256 in seen:
            continue
        seen.add(results.sha256)
        runs.setdefault(combo_id, []).append(_run(results, combo, base))
    for combo_runs in runs.values():
        combo_runs.sort(key=lambda r: (r.gpu, r.started, r.source_sha256))
    return runs, rejected
