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
    "STATUSES",
    "USES",
    "WORKAROUNDS",
    "CheckResult",
    "CheckSpec",
    "Impl",
    "Number",
    "Outcome",
    "Skip",
    "Status",
    "Use",
    "Workaround",
    "append_jsonl",
    "command_name",
    "describe_error",
    "matches",
    "ordered_uses",
    "read_jsonl",
]

Status: TypeAlias = Literal["pass", "fail", "skip", "error", "timeout", "invalid"]
Impl: TypeAlias = Literal["xformers", "sdpa"]
IMPLS: tuple[Impl, ...] = ("xformers", "sdpa")
#: ``dynamo-disable``: xformers wrapped in ``torch._dynamo.disable`` inside the compiled code;
#: ``sdpa-under-compile``: SDPA in xformers' place under ``torch.compile``;
#: ``sdpa-instead``: SDPA in xformers' place in eager code.
Workaround: TypeAlias = Literal["sdpa-under-compile", "dynamo-disable", "sdpa-instead"]
#: whether a workaround keeps xformers in the user's code (``dynamo-disable``) or replaces it
#: (the SDPA ones): a replacement is an answer ("use SDPA"), not a workaround of xformers.
KEEPS_XFORMERS: Mapping[Workaround, bool] = {
    "dynamo-disable": True,
    "sdpa-under-compile": False,
    "sdpa-instead": False,
}
#: every workaround, in the order `KEEPS_XFORMERS` lists them
WORKAROUNDS: tuple[Workaround, ...] = tuple(KEEPS_XFORMERS)
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
    one). ``workarounds`` are checks that re-run this check's exact case with a
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
        """``needs``, plus xformers for a check of the xformers implementation."""
        return self.needs | ({"xformers"} if self.impl == "xformers" else set())

    def meta(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gate": self.gate,
            "impl": self.impl,
            "workaround": self.workaround,
            "uses": list(self.uses),
            "covers": self.covers,
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

    @property
    def failed(self) -> bool:
        """A status that fails a gate: fail, error, timeout or invalid."""
        return self.status in FAILED

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
        )


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
