"""What a check is and what it returns; shared by the worker and the runner.

Standard library only: the runner (which must not import torch) uses it too.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

__all__ = [
    "FAILED",
    "IMPLS",
    "KEEPS_XFORMERS",
    "READABLE_RESULTS_SCHEMAS",
    "RESULTS_SCHEMA",
    "STATUSES",
    "USES",
    "VIAS",
    "WORKAROUNDS",
    "WORKAROUND_TIER",
    "CheckResult",
    "CheckSpec",
    "Impl",
    "Number",
    "Outcome",
    "Skip",
    "Status",
    "Use",
    "Via",
    "Workaround",
    "append_jsonl",
    "command_name",
    "decided_fault",
    "describe_error",
    "legacy_via",
    "matches",
    "ordered_uses",
    "read_jsonl",
]

#: the results document the suite writes (``via`` on each check is what /3 adds to /2), and
#: every one a reader still takes; the one home of these names
RESULTS_SCHEMA = "envbuilder.results/3"
READABLE_RESULTS_SCHEMAS: tuple[str, ...] = (
    "envbuilder.results/1",
    "envbuilder.results/2",
    RESULTS_SCHEMA,
)

Status: TypeAlias = Literal["pass", "fail", "skip", "error", "timeout", "invalid"]
Impl: TypeAlias = Literal["xformers", "sdpa"]
IMPLS: tuple[Impl, ...] = ("xformers", "sdpa")
#: ``mask-outside-compile``: the attention bias object (``LowerTriangularMask()``, …) built
#: outside the compiled function and passed in, xformers still called inside it;
#: ``mask-form``: the mask handed to an integration (diffusers) in a form it converts
#: correctly for xformers, the xformers backend kept;
#: ``dynamo-disable``: xformers wrapped in ``torch._dynamo.disable`` inside the compiled code;
#: ``sdpa-under-compile``: SDPA in xformers' place under ``torch.compile``;
#: ``sdpa-instead``: SDPA in xformers' place in eager code (for diffusers: its native backend).
Workaround: TypeAlias = Literal[
    "mask-outside-compile", "mask-form", "dynamo-disable", "sdpa-under-compile", "sdpa-instead"
]
#: whether a workaround keeps xformers in the user's code or replaces it (the SDPA ones):
#: a replacement is an answer ("use SDPA"), not a workaround of xformers.
KEEPS_XFORMERS: Mapping[Workaround, bool] = {
    "mask-outside-compile": True,
    "mask-form": True,
    "dynamo-disable": True,
    "sdpa-under-compile": False,
    "sdpa-instead": False,
}
#: the cost class a verdict ranks workarounds by, cheapest first: 0 keeps xformers with no
#: graph break, 1 keeps it behind a graph break, 2 replaces it.
WORKAROUND_TIER: Mapping[Workaround, int] = {
    "mask-outside-compile": 0,
    "mask-form": 0,
    "dynamo-disable": 1,
    "sdpa-under-compile": 2,
    "sdpa-instead": 2,
}
#: every workaround, in the order `KEEPS_XFORMERS` lists them
WORKAROUNDS: tuple[Workaround, ...] = tuple(KEEPS_XFORMERS)
#: the library a check reaches torch and xformers through, when it does not call them
#: directly: a combination pins torch and xformers, not these, so a check through one
#: speaks for that library's advisory, never for the combination's verdict.
Via: TypeAlias = Literal["diffusers"]
VIAS: tuple[Via, ...] = ("diffusers",)
#: what a user runs: eager forward under no_grad, the same compiled, an eager training
#: step (forward, backward, optimizer step), the same compiled.
Use: TypeAlias = Literal["inference", "inference-compiled", "training", "training-compiled"]
Number: TypeAlias = "int | float | str | bool | None"

STATUSES: tuple[Status, ...] = ("pass", "fail", "skip", "error", "timeout", "invalid")
#: every use, in the order results list them.
USES: tuple[Use, ...] = ("inference", "inference-compiled", "training", "training-compiled")
#: statuses of a gate that did not pass and was not skipped: each fails the gate.
FAILED: frozenset[Status] = frozenset({"fail", "error", "timeout", "invalid"})


def ordered_uses(uses: Iterable[Use]) -> tuple[Use, ...]:
    """``uses`` without duplicates, in the order of ``USES``."""
    wanted = set(uses)
    unknown = wanted - set(USES)
    if unknown:
        raise ValueError(f"unknown uses {sorted(unknown)!r}; known: {list(USES)}")
    return tuple(u for u in USES if u in wanted)


class Skip(Exception):
    """Raised inside a check: it cannot run here; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a check function returns: pass, fail or invalid, why, and what it measured.

    ``invalid``: a numeric check that could not have told a right answer from the
    nearest plausible wrong one (`envbuilder.conformance.tolerance.assess`).
    """

    status: Literal["pass", "fail", "invalid"]
    reason: str = ""
    numbers: Mapping[str, Number] = field(default_factory=dict)

    @classmethod
    def passed(cls, numbers: Mapping[str, Number] | None = None) -> Outcome:
        return cls(status="pass", numbers=dict(numbers or {}))

    @classmethod
    def failed(cls, reason: str, numbers: Mapping[str, Number] | None = None) -> Outcome:
        return cls(status="fail", reason=reason, numbers=dict(numbers or {}))

    @classmethod
    def invalid(cls, reason: str, numbers: Mapping[str, Number] | None = None) -> Outcome:
        return cls(status="invalid", reason=reason, numbers=dict(numbers or {}))

    @classmethod
    def judge(cls, problems: Iterable[str], numbers: Mapping[str, Number]) -> Outcome:
        """Pass when there are no problems, else fail with them joined as the reason."""
        found = list(problems)
        return cls.failed("; ".join(found), numbers) if found else cls.passed(numbers)


@dataclass(frozen=True, kw_only=True)
class CheckSpec:
    """One named check: its place in the verdict and the function that runs it.

    ``needs`` names what must be present, checked before ``run`` is called:
    ``cuda`` (the device is a CUDA device), ``xformers`` (importable),
    ``diffusers`` (importable), ``gpus2`` (two or more CUDA devices). A check
    whose ``impl`` is xformers needs xformers without saying so (``requires``).

    ``uses`` are the uses the check speaks for (a gate check names at least
    one). ``via`` is the library the check calls the kernels through (None: torch and
    xformers called directly, what the combination's verdict is made of). ``workarounds`` are checks that re-run this check's exact case with a
    workaround applied; the worker runs them only when this check fails, and
    each records ``covers`` = this check's name.
    """

    name: str
    gate: bool
    run: Callable[[], Outcome]
    uses: tuple[Use, ...] = ()
    impl: Impl | None = None
    workaround: Workaround | None = None
    covers: str | None = None
    via: Via | None = None
    needs: frozenset[str] = frozenset()
    quick: bool = True  # part of a --quick run
    workarounds: tuple[CheckSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.uses != ordered_uses(self.uses):
            raise ValueError(f"{self.name}: uses {self.uses!r} must be distinct, in {USES} order")
        if self.gate and not self.uses:
            raise ValueError(f"{self.name}: a gate check names the uses it speaks for")
        if (self.workaround is None) != (self.covers is None):
            raise ValueError(f"{self.name}: a workaround check, and only one, covers a check")

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def requires(self) -> frozenset[str]:
        """``needs``, plus xformers and a CUDA device for a check of the xformers
        implementation: xformers' attention kernels have no CPU implementation, so on a CPU
        run such a check says so instead of failing on an "operator not found"."""
        return self.needs | ({"xformers", "cuda"} if self.impl == "xformers" else set())

    def meta(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gate": self.gate,
            "impl": self.impl,
            "workaround": self.workaround,
            "uses": list(self.uses),
            "covers": self.covers,
            "via": self.via,
        }

    def covered_by(
        self, workaround: Workaround, run: Callable[[], Outcome], impl: Impl
    ) -> CheckSpec:
        """The check that re-runs this one's case with ``workaround`` applied."""
        return CheckSpec(
            name=f"{self.name}.{workaround.replace('-', '_')}",
            gate=True,
            run=run,
            uses=self.uses,
            impl=impl,
            workaround=workaround,
            covers=self.name,
            via=self.via,
            needs=self.needs,
            quick=self.quick,
        )


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One line of the JSONL stream and one entry of the results' ``checks``."""

    group: str
    name: str
    status: Status
    reason: str
    gate: bool
    impl: Impl | None
    workaround: Workaround | None
    numbers: Mapping[str, Number]
    duration_s: float
    uses: tuple[Use, ...] = ()
    covers: str | None = None
    via: Via | None = None

    @property
    def failed(self) -> bool:
        """A status that fails a gate: fail, error, timeout or invalid."""
        return self.status in FAILED

    @property
    def suite_error(self) -> bool:
        """An error raised in the suite's own code: evidence of nothing but a suite bug."""
        return is_suite_error(self.status, self.numbers)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "status": self.status,
            "reason": relative_paths(self.reason),
            "gate": self.gate,
            "impl": self.impl,
            "workaround": self.workaround,
            "uses": list(self.uses),
            "covers": self.covers,
            "via": self.via,
            "numbers": {
                k: relative_paths(v) if isinstance(v, str) else v for k, v in self.numbers.items()
            },
            "duration_s": round(self.duration_s, 3),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        status = data["status"]
        if status not in STATUSES:
            raise ValueError(f"check {data.get('name')!r}: unknown status {status!r}")
        return cls(
            group=data["group"],
            name=data["name"],
            status=status,
            reason=data.get("reason", ""),
            gate=bool(data["gate"]),
            impl=data.get("impl"),
            workaround=data.get("workaround"),
            numbers=dict(data.get("numbers", {})),
            duration_s=float(data.get("duration_s", 0.0)),
            uses=ordered_uses(data.get("uses", ())),
            covers=data.get("covers"),
            via=_via(data),
        )

    @classmethod
    def synthetic(
        cls, meta: Mapping[str, Any], status: Status, reason: str, duration_s: float = 0.0
    ) -> CheckResult:
        """A result the runner writes for a check that could not report itself."""
        name = str(meta["name"])
        return cls(
            group=name.split(".", 1)[0],
            name=name,
            status=status,
            reason=reason,
            gate=bool(meta.get("gate", True)),
            impl=meta.get("impl"),
            workaround=meta.get("workaround"),
            numbers={},
            duration_s=duration_s,
            uses=ordered_uses(meta.get("uses", ())),
            covers=meta.get("covers"),
            via=_via(meta),
        )


def is_suite_error(status: Status, numbers: Mapping[str, Number]) -> bool:
    """Whether a check's error was raised in the suite's own code (``fault_component`` =
    ``suite``): no verdict counts it, and ``repro`` refuses it."""
    return status == "error" and numbers.get("fault_component") == "suite"


def decided_fault(numbers: Mapping[str, Any]) -> tuple[str, str | None]:
    """Who an experiment found at fault and what decided it: ``fault_component`` with its
    ``fault_evidence``; ``("undecided", None)`` without that evidence (a component that a
    suite before 3.0 read from an error's message is no finding)."""
    component = numbers.get("fault_component")
    evidence = numbers.get("fault_evidence")
    if isinstance(component, str) and component and isinstance(evidence, str) and evidence:
        return component, evidence
    return "undecided", None


def legacy_via(name: str) -> Via | None:
    """The library a check of a results/2 file (which records no ``via``) went through:
    the mask and model groups call diffusers, every other check the kernels directly."""
    return "diffusers" if name.startswith(("masks.", "model.diffusers.")) else None


def _via(data: Mapping[str, Any]) -> Via | None:
    if "via" not in data:
        return legacy_via(str(data.get("name", "")))
    via = data["via"]
    if via is not None and via not in VIAS:
        raise ValueError(f"check {data.get('name')!r}: unknown via {via!r}; known: {list(VIAS)}")
    return via  # type: ignore[no-any-return]


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a check name is selected: each pattern is a glob, or a prefix of dotted parts.

    ``attention`` selects ``attention.sdpa.none.bf16``; ``*.xformers.*`` and
    ``compile.*.dynamic.*`` are globs. No patterns selects everything.
    """
    chosen = [p for p in patterns if p]
    if not chosen:
        return True
    for pattern in chosen:
        if fnmatch.fnmatchcase(name, pattern) or name.startswith(pattern.rstrip(".") + "."):
            return True
        if name == pattern:
            return True
    return False


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line and push it to disk, so that a crash right after loses nothing."""
    line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file; a torn last line (a crash mid-write) is dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


#: The checkout the suite runs from; tracebacks name files relative to it in results.
_CHECKOUT = str(Path(__file__).resolve().parents[2]) + os.sep


@functools.cache
def _import_roots() -> tuple[str, ...]:
    """The suite's checkout and every directory on ``sys.path`` (as it is when first
    asked), longest first, each ending in a separator; the filesystem root is never one."""
    roots = {_CHECKOUT}
    for entry in sys.path:
        path = Path(entry)
        if entry and path.is_absolute() and path.is_dir() and path != Path(path.anchor):
            roots.add(os.path.normpath(entry) + os.sep)
    return tuple(sorted(roots, key=len, reverse=True))


def relative_paths(text: str) -> str:
    """``text`` with file names made relative to the directory they were imported
    from (``/…/site-packages/xformers/_C.so`` -> ``xformers/_C.so``): results files
    are published, and the runner's directory layout is not a finding."""
    for root in _import_roots():
        text = text.replace(root, "")
    return text


def command_name(command: str | None) -> str | None:
    """A command the runner found (``/opt/gcc/bin/gcc``) by its file name (``gcc``):
    results are published, and where the runner keeps its tools is not a finding (the
    tool's ``--version`` line says which one it is)."""
    return (Path(command).name or None) if command else None


def describe_error(error: BaseException, limit: int = 1500) -> str:
    """An exception as one line that keeps what explains it.

    For xformers' "No operator found" errors that is the first line, the
    ``attn_bias`` line and each operator's "not supported because" reasons,
    which come after the (long) list of input shapes.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("attn_bias")), None)
    keep = lines[:1] + lines[start:] if start is not None else lines[:6]
    return f"{type(error).__name__}: {' | '.join(keep)}"[:limit]
