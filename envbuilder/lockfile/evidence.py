"""What the lockfile says was measured and what it concluded: each check's outcome and
numbers, the runs, the verdicts (per GPU, per use, with the workarounds they rely on and
the advisories of libraries the row does not pin) and when a lock was last verified.

Part of the lockfile's document (`envbuilder.lockfile.model` re-exports every name):
standard library and the suite's stdlib-only record module only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

# The check vocabulary is the suite's (its record module is standard library only):
# what a check's status, use and workaround can be is defined once, where checks are made.
from envbuilder.conformance._record import (
    IMPLS,
    STATUSES,
    USES,
    VIAS,
    WORKAROUND_TIER,
    WORKAROUNDS,
    Impl,
    Status,
    Use,
    Via,
    Workaround,
    decided_fault,
    is_suite_error,
    legacy_via,
)

__all__ = [
    "INSTALLABLE",
    "VERDICTS",
    "VERDICT_RANK",
    "Advisory",
    "CheckOutcome",
    "GpuVerdict",
    "InfoCheck",
    "LastVerified",
    "Measurement",
    "Run",
    "Scalar",
    "UseVerdict",
    "Verdict",
    "VerdictName",
    "WorkaroundChoice",
    "WorkaroundCost",
    "WorkaroundOption",
    "run_date",
    "use_verdict",
    "use_verdicts_from_json",
]

VerdictName = Literal[
    "verified",
    "verified-with-workaround",
    "xformers-unusable",
    "unverified",
    "broken",
    "unsatisfiable",
]
#: Best first; ``query`` sorts by this and the combined verdict of several GPUs is the worst.
VERDICTS: tuple[VerdictName, ...] = (
    "verified",
    "verified-with-workaround",
    "xformers-unusable",
    "unverified",
    "broken",
    "unsatisfiable",
)
#: the verdicts `install` installs and the site offers an install command for
INSTALLABLE: frozenset[VerdictName] = frozenset({"verified", "verified-with-workaround"})
VERDICT_RANK: dict[str, int] = {v: i for i, v in enumerate(VERDICTS)}


#: A value in a check's ``numbers`` (JSON scalars; non-finite floats are kept as their names).
Scalar = float | int | str | bool | None


def _number(numbers: Mapping[str, Scalar], key: str) -> float | None:
    value = numbers.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _breaks(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True)
class WorkaroundChoice:
    """The workaround a verdict relies on for one failed direct check, and what it cost there.

    ``tier`` is the workaround's cost class (`WORKAROUND_TIER`: 0 keeps xformers with no graph
    break, 1 keeps it behind a graph break, 2 replaces it); ``breaks_per_call`` and
    ``breaks_per_step`` are the graph breaks measured per attention call and per training or
    inference step of the model (None: not measured); ``drops_fullgraph``: the covered case
    compiled with ``fullgraph=True``, which a graph break gives up. ``step_ms`` is recorded,
    never ranked by: at these sizes it is launch overhead."""

    check: str  # the failed direct gate check
    workaround: Workaround
    evidence: tuple[str, ...]  # the workaround checks that passed on that check's case
    graph_breaks: int | None  # None: not measured (results/1)
    step_ms: float | None
    tier: int = 0
    breaks_per_call: float | None = None
    breaks_per_step: float | None = None
    drops_fullgraph: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkaroundChoice:
        workaround = _one_of(data["workaround"], WORKAROUNDS, "workaround")
        return cls(
            check=data["check"],
            workaround=workaround,
            evidence=tuple(data.get("evidence", ())),
            **_costs(data, workaround),
        )


def _costs(data: Mapping[str, Any], workaround: Workaround) -> dict[str, Any]:
    """A workaround's measured costs as `WorkaroundChoice` and `WorkaroundOption` record
    them (the tier defaults to the workaround's own)."""
    return {
        "graph_breaks": data.get("graph_breaks"),
        "step_ms": data.get("step_ms"),
        "tier": int(data.get("tier", WORKAROUND_TIER[workaround])),
        "breaks_per_call": _breaks(data.get("breaks_per_call")),
        "breaks_per_step": _breaks(data.get("breaks_per_step")),
        "drops_fullgraph": bool(data.get("drops_fullgraph", False)),
    }


@dataclass(frozen=True, kw_only=True)
class WorkaroundOption:
    """One workaround verified for a use: the failed checks it passed and its worst cost there.

    ``keeps_xformers``: the user's code still calls xformers (``dynamo-disable``); otherwise
    it replaces xformers (the SDPA ones) and is an answer, not a workaround of xformers. The
    costs are as `WorkaroundChoice`'s, the worst over ``fixes`` (``drops_fullgraph``: on any)."""

    workaround: Workaround
    keeps_xformers: bool
    fixes: tuple[str, ...]  # the failed direct gate checks it passed on, sorted
    graph_breaks: int | None  # the most over those cases; None: some case did not measure it
    step_ms: float | None
    tier: int = 0
    breaks_per_call: float | None = None
    breaks_per_step: float | None = None
    drops_fullgraph: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkaroundOption:
        workaround = _one_of(data["workaround"], WORKAROUNDS, "workaround")
        return cls(
            workaround=workaround,
            keeps_xformers=bool(data["keeps_xformers"]),
            fixes=tuple(data.get("fixes", ())),
            **_costs(data, workaround),
        )


@dataclass(frozen=True, kw_only=True)
class InfoCheck:
    """A check that gates nothing (``gate = false``), kept beside an advisory as evidence of
    who is hit: which inputs reach the faulty path and which do not."""

    name: str
    status: Status
    reason: str  # its first line, cut

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InfoCheck:
        return cls(
            name=data["name"],
            status=_one_of(data["status"], STATUSES, "check status"),
            reason=data.get("reason", ""),
        )


@dataclass(frozen=True, kw_only=True)
class Advisory:
    """The verdict, for one use, of a library the combination does not pin but the suite calls
    the kernels through (``via``): judged by the same rules over that library's checks only.

    It never changes the combination's verdict (what ``install`` gates on); consumers show it
    beside the row, named with the version the checks recorded (``diffusers 0.42.1 xformers
    backend``)."""

    via: Via
    library: str  # "diffusers"
    version: str | None  # as the checks recorded it (their ``numbers[via]``); None: not recorded
    name: str  # "diffusers 0.42.1 xformers backend": the library, its version, the backend at fault
    verdict: Verdict  # its own advisories are empty
    info: tuple[InfoCheck, ...] = ()  # the library's checks that gate nothing, by name

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Advisory:
        return cls(
            via=_one_of(data["via"], VIAS, "via"),
            library=data["library"],
            version=data.get("version"),
            name=data["name"],
            verdict=Verdict.from_json(data["verdict"]),
            info=tuple(InfoCheck.from_json(i) for i in data.get("info", ())),
        )


@dataclass(frozen=True, kw_only=True)
class Verdict:
    verdict: VerdictName
    reason: str
    workarounds: tuple[str, ...] = ()  # what made it work: "dynamo-disable", "cuda-runtime:<req>"
    failing_checks: tuple[str, ...] = ()  # gate checks that failed (broken: those not covered)
    choices: tuple[WorkaroundChoice, ...] = ()  # per worked-around check, the cheapest workaround
    #: every workaround verified on some failed check, cheapest first (tier, breaks per step)
    options: tuple[WorkaroundOption, ...] = ()
    #: checks whose error was raised in the suite's own code: listed, counted nowhere
    suite_errors: tuple[str, ...] = ()
    #: per library the suite reaches the kernels through, its own verdict (never this one's)
    advisories: tuple[Advisory, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            verdict=_one_of(data["verdict"], VERDICTS, "verdict"),
            reason=data["reason"],
            workarounds=tuple(data.get("workarounds", ())),
            failing_checks=tuple(data.get("failing_checks", ())),
            choices=tuple(WorkaroundChoice.from_json(c) for c in data.get("choices", ())),
            options=tuple(WorkaroundOption.from_json(o) for o in data.get("options", ())),
            suite_errors=tuple(data.get("suite_errors", ())),
            advisories=tuple(Advisory.from_json(a) for a in data.get("advisories", ())),
        )


@dataclass(frozen=True, kw_only=True)
class UseVerdict:
    """The verdict for one use; records carry one per `USES` entry, in that order."""

    use: Use
    verdict: Verdict

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UseVerdict:
        return cls(
            use=_one_of(data["use"], USES, "use"), verdict=Verdict.from_json(data["verdict"])
        )


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    """*value* when it is one of *allowed*; a reader meets no name it cannot rank or show."""
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


def _optional_one_of(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    return None if value is None else _one_of(value, allowed, what)


def use_verdicts_from_json(data: Any) -> tuple[UseVerdict, ...]:
    """A record's per-use verdicts: exactly one per `USES` entry, in that order."""
    uses = tuple(UseVerdict.from_json(u) for u in data)
    if tuple(u.use for u in uses) != USES:
        raise ValueError(
            f"per-use verdicts list {[u.use for u in uses]}, not {', '.join(USES)} in that order"
        )
    return uses


def use_verdict(uses: tuple[UseVerdict, ...], use: Use) -> Verdict:
    """The verdict for *use* among *uses* (a record's per-use verdicts)."""
    for item in uses:
        if item.use == use:
            return item.verdict
    raise KeyError(use)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What a numeric check measured against its bound, and whether it could have failed."""

    error: float
    bound: float
    sensitivity: float  # distance from the reference to the nearest plausible wrong answer
    sensitivity_ratio: float  # sensitivity / bound; the suite records `invalid` below 4


@dataclass(frozen=True, kw_only=True)
class WorkaroundCost:
    """A workaround check's cost on its case, as it recorded it (None: not measured)."""

    graph_breaks: int | None  # the graph breaks of the check's own compiled function
    step_ms: float | None  # recorded, never ranked by (launch overhead at these sizes)
    breaks_per_call: float | None = None  # ``graph_breaks_per_call``
    breaks_per_step: float | None = None  # ``graph_breaks_per_step``
    drops_fullgraph: bool | None = None  # ``drops_fullgraph``


@dataclass(frozen=True, kw_only=True)
class CheckOutcome:
    """One check of a run. ``uses`` is None for a results/1 check (untagged: every use).

    ``via``: the library the check reached torch and xformers through (None: called
    directly, what the combination pins); a check of a compat/3 or older lockfile, or of a
    results/2 file, takes it from its name (`legacy_via`)."""

    name: str
    group: str
    status: Status
    reason: str
    gate: bool
    impl: Impl | None
    workaround: Workaround | None
    numbers: Mapping[str, Scalar]
    duration_s: float | None
    uses: tuple[Use, ...] | None = None
    covers: str | None = None  # a workaround check: the direct check whose case it re-ran
    via: Via | None = None

    @property
    def direct_gate(self) -> bool:
        return self.gate and self.workaround is None

    @property
    def suite_error(self) -> bool:
        """An error raised in the suite's own code: evidence of nothing but a suite bug."""
        return is_suite_error(self.status, self.numbers)

    @property
    def fault(self) -> str:
        """Who an experiment found at fault (``numbers.fault_component`` with its
        ``fault_evidence``); ``undecided`` without one: a component a suite before 3.0 read
        from the error's message is no finding. A suite error is the suite's."""
        return "suite" if self.suite_error else decided_fault(self.numbers)[0]

    @property
    def fault_evidence(self) -> str | None:
        """The experiment that decided `fault` (None: undecided)."""
        return decided_fault(self.numbers)[1]

    def speaks_for(self, use: Use) -> bool:
        return self.uses is None or use in self.uses

    @property
    def measurement(self) -> Measurement | None:
        values = [
            _number(self.numbers, k) for k in ("error", "bound", "sensitivity", "sensitivity_ratio")
        ]
        error, bound, sensitivity, ratio = values
        if error is None or bound is None or sensitivity is None or ratio is None:
            return None
        return Measurement(
            error=error, bound=bound, sensitivity=sensitivity, sensitivity_ratio=ratio
        )

    @property
    def cost(self) -> WorkaroundCost:
        breaks = _number(self.numbers, "graph_breaks")
        drops = self.numbers.get("drops_fullgraph")
        return WorkaroundCost(
            graph_breaks=None if breaks is None else int(breaks),
            step_ms=_number(self.numbers, "step_ms"),
            breaks_per_call=_number(self.numbers, "graph_breaks_per_call"),
            breaks_per_step=_number(self.numbers, "graph_breaks_per_step"),
            drops_fullgraph=drops if isinstance(drops, bool) else None,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckOutcome:
        uses = data.get("uses")
        if not isinstance(data["name"], str):
            raise ValueError(f"check name {data['name']!r} is not a string")
        return cls(
            name=data["name"],
            group=data["group"],
            status=_one_of(data["status"], STATUSES, "check status"),
            reason=data.get("reason", ""),
            gate=bool(data.get("gate", False)),
            impl=_optional_one_of(data.get("impl"), IMPLS, "impl"),
            workaround=_optional_one_of(data.get("workaround"), WORKAROUNDS, "workaround"),
            numbers=dict(data.get("numbers") or {}),
            duration_s=data.get("duration_s"),
            uses=None if uses is None else tuple(u for u in USES if u in uses),
            covers=data.get("covers"),
            via=_optional_one_of(data["via"], VIAS, "via")
            if "via" in data
            else legacy_via(data["name"]),
        )


def run_date(finished: str) -> str:
    """The date (YYYY-MM-DD, UTC) of a run that finished at *finished* (ISO 8601 with a zone).

    A time without a zone, or no time at all, gives its first ten characters: results files
    are checked for a readable time before they are merged, so only a hand-made record can."""
    try:
        moment = datetime.fromisoformat(finished)
    except ValueError:
        return finished[:10]
    return moment.astimezone(UTC).date().isoformat() if moment.tzinfo else finished[:10]


@dataclass(frozen=True, kw_only=True)
class Run:
    """One accepted results file: where it ran and what every check said, and when."""

    source: str  # the results file, relative to the lockfile where possible
    source_sha256: str
    lock_sha256: str | None  # the lock it ran on (None: an unsatisfiable combination's run)
    suite_version: str
    started: str
    finished: str
    gpu: str  # name of the first GPU, "cpu" without one
    compute_capability: str | None
    runner: Mapping[str, Any]
    checks: tuple[CheckOutcome, ...]
    uses: tuple[UseVerdict, ...]  # one per use, in `USES` order
    verdict: Verdict  # the worst of `uses`
    date: str = ""  # YYYY-MM-DD (UTC) it finished; `run_date(finished)` when not given

    def __post_init__(self) -> None:
        if not self.date:
            object.__setattr__(self, "date", run_date(self.finished))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls(  # `date` is made from `finished` again: compat/2 runs carry none
            source=data["source"],
            source_sha256=data["source_sha256"],
            lock_sha256=data.get("lock_sha256"),
            suite_version=data["suite_version"],
            started=data["started"],
            finished=data["finished"],
            gpu=data["gpu"],
            compute_capability=data.get("compute_capability"),
            runner=dict(data.get("runner") or {}),
            checks=tuple(CheckOutcome.from_json(c) for c in data.get("checks", ())),
            uses=use_verdicts_from_json(data["uses"]),
            verdict=Verdict.from_json(data["verdict"]),
        )


@dataclass(frozen=True, kw_only=True)
class GpuVerdict:
    """The verdict on one GPU model; ``conflict`` when its runs disagree (all are kept)."""

    gpu: str
    compute_capability: str | None
    verdict: Verdict
    uses: tuple[UseVerdict, ...]  # per use the worst of the runs, in `USES` order
    runs: tuple[str, ...]  # sources of the runs on this GPU
    conflict: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuVerdict:
        return cls(
            gpu=data["gpu"],
            compute_capability=data.get("compute_capability"),
            verdict=Verdict.from_json(data["verdict"]),
            uses=use_verdicts_from_json(data["uses"]),
            runs=tuple(data.get("runs", ())),
            conflict=bool(data.get("conflict", False)),
        )


@dataclass(frozen=True, kw_only=True)
class LastVerified:
    """When a combination's verdict was last measured, on which lock: evidence with an age.

    With runs on the current lock: those runs, the entry's own verdict. Without: the older
    lock whose newest run finished last (the lock moved since, so those runs do not count for
    the current lock's verdict; they say what was last known and when). For a retired
    combination: the lock of its newest run."""

    lock_sha256: str | None  # that lock; None: the runs of an unsatisfiable combination
    date: str  # YYYY-MM-DD: when the newest run on that lock finished
    suite_version: str  # the suite of that newest run
    verdict: Verdict  # that lock's verdict, judged as a combination's (worst GPU, worst use)
    uses: tuple[UseVerdict, ...]  # per use, in `USES` order
    runs: tuple[str, ...]  # sources of the runs on that lock

    def describe(self, verdict: Verdict | None = None) -> str:
        """``last verified <date> on lock <sha12>: <verdict>`` (of one use when given)."""
        chosen = self.verdict if verdict is None else verdict
        lock = f" on lock {self.lock_sha256[:12]}" if self.lock_sha256 else ""
        return f"last verified {self.date}{lock}: {chosen.verdict}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LastVerified:
        return cls(
            lock_sha256=data.get("lock_sha256"),
            date=data["date"],
            suite_version=data["suite_version"],
            verdict=Verdict.from_json(data["verdict"]),
            uses=use_verdicts_from_json(data["uses"]),
            runs=tuple(data.get("runs", ())),
        )
