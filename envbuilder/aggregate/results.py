"""Reading conformance results files (``envbuilder.results/3``; /2 and /1 as older evidence).

A results file is validated against the JSON Schema of the results schema it
names: the packaged ``envbuilder/schemas/results.schema.json`` when its
``$id`` is that schema, else the shape docs/contracts.md documents for it
(`documented_shape`). A results/2 file must also keep the contract's rules
that a schema cannot state: a workaround check ``covers`` a direct gate check
of the same file and lists the same ``uses``; a gate check lists at least one
use.

A results file is *rejected* (never merged) when it is not JSON or nests
deeper than envbuilder reads, fails the results JSON Schema or those rules,
comes from a newer results schema or a newer suite major version than this
envbuilder understands, has a ``started`` or ``finished`` that is not an ISO
8601 time with a zone (a run without a date), names no combination, or is
another file's run (`run_identity`) with other content. A file naming a
combination the resolution does not have is *retired* evidence (kept in the
lockfile's ``retired`` section, never counted) when its ``lock_sha256`` is
null or a sha256. Otherwise its ``lock_sha256`` binds it (`bind`):

=================  ==========================  =====================================
the combination    the run's ``lock_sha256``   the run is
=================  ==========================  =====================================
resolved           the current lock's          *current*: its checks make the verdict
resolved           another sha256              *stale*: evidence on an older lock of
                                                 the combination (the lock moved since
                                                 it ran), kept with its lock hash,
                                                 suite version and date; it never
                                                 counts for the current lock
resolved           null                        rejected: not tied to any lock
resolved           not a sha256 hex digest     rejected: malformed
unsatisfiable      null                        *current*: evidence for the resolver's
                                                 reason (the verdict stays
                                                 ``unsatisfiable``)
unsatisfiable      a sha256                    rejected: the combination has no lock
error              anything                    rejected: nothing was resolved
=================  ==========================  =====================================
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from envbuilder.aggregate.claims import claim_problems
from envbuilder.conformance._record import (
    READABLE_RESULTS_SCHEMAS,
    RESULTS_SCHEMA,
    STATUSES,
    USES,
    VIAS,
)
from envbuilder.files import sha256_file
from envbuilder.jsondoc import NotJSON, parse
from envbuilder.lockfile.canonical import finite
from envbuilder.lockfile.model import CheckOutcome, RejectedResults, Run
from envbuilder.lockfile.verdicts import overall, run_use_verdicts
from envbuilder.model import ResolvedCombination

__all__ = [
    "CARRIED_FROM",
    "READABLE_SCHEMAS",
    "RESULTS_SCHEMA",
    "SUPPORTED_SUITE_MAJOR",
    "Accepted",
    "Binding",
    "Rejected",
    "ResultsFile",
    "accept",
    "bind",
    "carried_source",
    "documented_shape",
    "find_results",
    "read_results",
    "rejection_record",
    "run_identity",
    "run_order",
]

#: /3 is /2 with each check's ``via`` (a /2 check takes it from its name: `legacy_via`)
#: Results schemas this envbuilder merges: the current one and the older evidence.
READABLE_SCHEMAS = READABLE_RESULTS_SCHEMAS
SUPPORTED_SUITE_MAJOR = 3

_STATUS_1 = ["pass", "fail", "skip", "error", "timeout"]
_SCALAR: dict[str, Any] = {"type": ["number", "string", "boolean", "null"]}

#: The results/1 shape documented in docs/contracts.md.
_DOCUMENTED_SHAPE_1: dict[str, Any] = {
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
        "schema": {"const": "envbuilder.results/1"},
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
                    "status": {"enum": _STATUS_1},
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


def documented_shape(schema: str) -> dict[str, Any]:
    """The shape docs/contracts.md documents for *schema* (results/2 = results/1 plus its
    fields; results/3 = results/2 plus each check's ``via``)."""
    shape = copy.deepcopy(_DOCUMENTED_SHAPE_1)
    if schema == "envbuilder.results/1":
        return shape
    shape["properties"]["schema"] = {"const": schema}
    item = shape["properties"]["checks"]["items"]
    item["required"] += ["uses", "covers"]
    item["properties"]["status"] = {"enum": list(STATUSES)}
    item["properties"]["uses"] = {
        "type": "array",
        "items": {"enum": list(USES)},
        "uniqueItems": True,
    }
    item["properties"]["covers"] = {"type": ["string", "null"]}
    if schema != "envbuilder.results/2":
        item["required"] += ["via"]
        item["properties"]["via"] = {"enum": [*VIAS, None]}
    return shape


@cache
def _packaged() -> Mapping[str, Any] | None:
    packaged = resources.files("envbuilder").joinpath("schemas/results.schema.json")
    if not packaged.is_file():
        return None
    loaded: Mapping[str, Any] = json.loads(packaged.read_text(encoding="utf-8"))
    return loaded


def _schema(name: str) -> Mapping[str, Any]:
    """The JSON Schema a file naming results schema *name* is validated against."""
    packaged = _packaged()
    takes = packaged.get("properties", {}).get("schema", {}).get("enum", ()) if packaged else ()
    if packaged is not None and name in takes and name != "envbuilder.results/1":
        return packaged  # the current schema, which still takes the one before it
    return documented_shape(name)


def _contract_problems(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a results/2 file breaks of the contract beyond its JSON Schema."""
    by_name = {c["name"]: c for c in checks}
    problems: list[str] = []
    for c in checks:
        name, workaround, covered = c["name"], c.get("workaround"), c.get("covers")
        if (workaround is None) != (covered is None):
            problems.append(
                f"check {name!r}: covers must be set exactly when workaround is "
                f"(workaround {workaround!r}, covers {covered!r})"
            )
        elif covered is not None:
            target = by_name.get(covered)
            if target is None or not target.get("gate") or target.get("workaround") is not None:
                problems.append(
                    f"check {name!r} covers {covered!r}, which is not a direct gate check "
                    "of this file"
                )
            elif list(c.get("uses") or []) != list(target.get("uses") or []):
                problems.append(
                    f"check {name!r} lists uses {c['uses']} but covers {covered!r}, "
                    f"which lists {target['uses']}"
                )
        if c.get("gate") and workaround is None and not c.get("uses"):
            problems.append(f"gate check {name!r} lists no uses, so it would count for none")
    return problems


def _major(version: object) -> int | None:
    if not isinstance(version, str):
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def read_results(path: Path) -> ResultsFile:
    """Read and validate one results file, raising `Rejected` with the reason."""
    from envbuilder.extras import require

    jsonschema = require("jsonschema", extra="resolve", needed_for="reading conformance results")

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise Rejected(path, f"cannot be read ({e.strerror})") from e
    try:
        data = parse(raw)
    except NotJSON as e:
        raise Rejected(path, str(e)) from e
    if not isinstance(data, dict):
        raise Rejected(path, "not a results file (the top level is not an object)")
    schema = data.get("schema")
    if schema not in READABLE_SCHEMAS:
        if isinstance(schema, str) and schema.startswith("envbuilder.results/"):
            raise Rejected(
                path,
                f"results schema {schema!r} is not one of {', '.join(READABLE_SCHEMAS)}; "
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
        jsonschema.Draft202012Validator(_schema(schema)).iter_errors(data),
        key=lambda e: list(e.path),
    )
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise Rejected(path, f"fails the results schema at {where}: {first.message}{more}")
    counts = Counter(c["name"] for c in data["checks"])  # linear: files hold 10^5 checks
    duplicates = sorted(n for n, k in counts.items() if k > 1)
    if duplicates:
        raise Rejected(path, f"check names are not unique: {', '.join(map(repr, duplicates))}")
    if schema != "envbuilder.results/1":
        problems = _contract_problems(data["checks"])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise Rejected(path, f"breaks the results contract: {problems[0]}{more}")
    for key in ("started", "finished"):
        if _moment(data[key]) is None:
            raise Rejected(
                path,
                f"{key} {data[key]!r} is not an ISO 8601 time with a zone (such as "
                "2026-11-20T10:04:00Z): a run without a date cannot be kept as evidence",
            )
    return ResultsFile(path=path, sha256=hashlib.sha256(raw).hexdigest(), data=data)


def _moment(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


RunIdentity = tuple[str, str, str, str, str, str]


def run_identity(combination: str, run: Run) -> RunIdentity:
    """What makes two records the same run, whatever file or lockfile carries them.

    The combination, the lock it ran on, the runner's host name, the GPU (name and compute
    capability) and the moment it started (in UTC, so that ``Z`` and ``+00:00`` agree).
    Two runs of one runner on one day stay two runs; a results file merged again (committed,
    then read back from the previous lockfile) is one."""
    moment = _moment(run.started)
    return (
        combination,
        run.lock_sha256 or "",
        str(run.runner.get("hostname", "")),
        run.gpu,
        run.compute_capability or "",
        moment.isoformat() if moment else run.started,
    )


def find_results(paths: Iterable[Path]) -> list[Path]:
    """Expand directories to the ``*.json`` files below them, sorted; keep files as given.

    A ``build-records`` directory below holds source builds' records, not results: skipped."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(
                p
                for p in path.rglob("*.json")
                if p.is_file() and "build-records" not in p.relative_to(path).parts[:-1]
            )
        else:
            found.append(path)
    return found


#: how a carried run's ``source`` begins when its path points nowhere (docs/contracts.md)
CARRIED_FROM = "carried from lockfile "


def carried_source(run: Run, *, lockfile_sha256: str, base: Path) -> str:
    """The ``source`` of *run*, carried out of the lockfile whose ``content_sha256`` is
    *lockfile_sha256* into one in the directory *base*. Its path was relative to that
    lockfile: kept where it leads, from *base*, to the bytes the run was read from
    (``source_sha256``), so a lockfile made in parts is the one made at once; else
    ``carried from lockfile <sha256>: <path>``, naming the lockfile the path belongs to. A
    source already carried so keeps the lockfile it first came from."""
    source = run.source
    if source.startswith(CARRIED_FROM):
        return source
    relative = PurePosixPath(source)
    if source and not relative.is_absolute() and not relative.drive:
        candidate = base / relative
        if candidate.is_file() and sha256_file(candidate) == run.source_sha256:
            return source
    return f"{CARRIED_FROM}{lockfile_sha256}: {source}"


def _relative(path: Path, base: Path) -> str:
    try:
        return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()
    except ValueError:  # another drive
        return path.name


def _run(results: ResultsFile, extra_runtime: Sequence[str], base: Path) -> Run:
    data = finite(results.data)
    checks = tuple(
        sorted((CheckOutcome.from_json(c) for c in data["checks"]), key=lambda c: c.name)
    )
    gpus = data["runner"].get("gpus") or []
    first = gpus[0] if gpus else None
    uses = run_use_verdicts(checks, extra_runtime)
    return Run(
        source=_relative(results.path, base),
        source_sha256=results.sha256,
        lock_sha256=data["lock_sha256"],
        suite_version=data["suite_version"],
        started=data["started"],
        finished=data["finished"],
        gpu=first["name"] if first else "cpu",
        compute_capability=first["compute_capability"] if first else None,
        runner=data["runner"],
        checks=checks,
        uses=uses,
        verdict=overall(uses),
    )


def rejection_record(rejected: Rejected, base: Path) -> RejectedResults:
    """How the lockfile lists a rejected file (with ``--skip-rejected``)."""
    return RejectedResults(file=_relative(rejected.path, base), reason=rejected.reason)


Binding = Literal["current", "stale"]
_SHA256 = re.compile(r"[0-9a-f]{64}")


def bind(lock_sha256: object, combo: ResolvedCombination) -> Binding:
    """Whether a run on *lock_sha256* is evidence for *combo*'s current lock or an older one
    (the module's table); raises `ValueError` with the reason when it is neither."""
    cid = combo.id
    if combo.status == "unsatisfiable":
        # Evidence for the resolver's reason (e.g. the extension really fails to load);
        # there is no lock to bind to, and the verdict stays `unsatisfiable`.
        if lock_sha256 is not None:
            raise ValueError(
                f"combination {cid!r} is unsatisfiable and has no lock, but this run "
                f"names lock_sha256 {lock_sha256!r}"
            )
        return "current"
    if combo.status != "resolved":
        raise ValueError(f"combination {cid!r} is {combo.status}, not resolved")
    if lock_sha256 is None:
        raise ValueError(
            f"lock_sha256 is null: this run is not tied to the lock of {cid!r}; run the "
            "suite through `envbuilder conformance` (in the combination's image, or "
            "--in-place in an environment that is the combination), which records it"
        )
    if not isinstance(lock_sha256, str) or not _SHA256.fullmatch(lock_sha256):
        raise ValueError(f"lock_sha256 {lock_sha256!r} is not a sha256 hex digest")
    return "current" if lock_sha256 == combo.lock_sha256 else "stale"


def _retired_lock(lock_sha256: object) -> None:
    """A retired combination's run must still name a lock it could have run on, or none."""
    if lock_sha256 is not None and (
        not isinstance(lock_sha256, str) or not _SHA256.fullmatch(lock_sha256)
    ):
        raise ValueError(f"lock_sha256 {lock_sha256!r} is not a sha256 hex digest")


def run_order(run: Run) -> tuple[str, str, str, str]:
    """How a combination's runs are listed: by lock, GPU, start, content."""
    return (run.lock_sha256 or "", run.gpu, run.started, run.source_sha256)


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """The runs merged per combination id: on its current lock, on older ones, of combinations
    the resolution no longer has (`retired`); the rejections."""

    current: Mapping[str, Sequence[Run]]
    stale: Mapping[str, Sequence[Run]]
    retired: Mapping[str, Sequence[Run]]
    rejected: Sequence[Rejected]


def accept(
    files: Sequence[Path],
    combinations: Mapping[str, ResolvedCombination],
    *,
    base: Path,
    locked: Mapping[str, Mapping[str, str]] | None = None,
    built: Mapping[str, Mapping[str, str]] | None = None,
) -> Accepted:
    """Read every file and bind it (`bind`): runs per combination id, and the rejections.

    ``base`` is the lockfile's directory: run sources are recorded relative to
    it. Byte-identical files are merged once; a file that is another one's run
    (`run_identity`) with other content is rejected, naming both. A file whose
    findings contradict its combination (`envbuilder.aggregate.claims`) is rejected
    with them; ``locked`` gives each combination's current lock (name -> version) and
    ``built`` each source build's recorded libraries (path -> sha256).
    """
    found: dict[Binding | Literal["retired"], dict[str, list[Run]]] = {
        "current": {},
        "stale": {},
        "retired": {},
    }
    rejected: list[Rejected] = []
    seen: set[str] = set()
    identities: dict[RunIdentity, Path] = {}
    for path in files:
        try:
            results = read_results(path)
            combo_id = results.data["combination"]
            if combo_id is None:
                raise Rejected(path, "names no combination (combination = null)")
            combo = combinations.get(combo_id)
            try:
                if combo is None:
                    _retired_lock(results.data["lock_sha256"])
                binding: Binding | Literal["retired"] = (
                    "retired" if combo is None else bind(results.data["lock_sha256"], combo)
                )
            except ValueError as e:
                raise Rejected(path, str(e)) from e
            if combo is not None:
                current = (locked or {}).get(combo_id) if binding == "current" else None
                libraries = (built or {}).get(combo_id) if binding == "current" else None
                problems = claim_problems(results.data, combo, locked=current, built=libraries)
                if problems:
                    raise Rejected(
                        path,
                        f"its environment is not that of {combo_id!r}: {'; '.join(problems)}",
                    )
            if results.sha256 in seen:
                continue
            run = _run(results, combo.extra_runtime if combo else (), base)
            identity = run_identity(combo_id, run)
            if identity in identities:
                raise Rejected(
                    path,
                    f"the same run as {identities[identity]} (combination, lock, runner, GPU "
                    "and start time) with other content; keep the one that is right",
                )
        except Rejected as e:
            rejected.append(e)
            continue
        seen.add(results.sha256)
        identities[identity] = path
        found[binding].setdefault(combo_id, []).append(run)
    for runs in found.values():
        for combo_runs in runs.values():
            combo_runs.sort(key=run_order)
    return Accepted(
        current=found["current"],
        stale=found["stale"],
        retired=found["retired"],
        rejected=rejected,
    )
