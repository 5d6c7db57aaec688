"""Which component a failing check points at, and a cause that groups failures.

A failing check records the operator that failed when an error names one and
always a ``cause``: one short line that is the same for every check failing for
the same reason (shapes, sizes, dtypes, device numbers and their order are
normalised away), so that results can be grouped by it:

- ``fault_op``: the first operator an error names (``aten._efficient_attention_backward``,
  ``xformers_flash.flash_fwd``), without its overload;
- ``cause``: a known failure's stable name (``FakeTensor device propagation in
  aten._efficient_attention_backward``), else the root exception's type and
  first line, normalised;
- ``fault_component`` and ``fault_evidence``: who is at fault is an experiment,
  never read from a message. A check that fails records ``undecided`` here;
  the counterfactual runs (`envbuilder.conformance._counterfactual`: the kernel
  swapped for an exact one inside the same wrapper, the kernel called directly,
  the failing op's glue isolated) replace it with the component they decide and
  what they measured (`decided`). The one exception is an error raised in the
  suite's own code (`error_fault`: its innermost frame is the suite's and it is
  no CUDA error): ``suite``, counted by no verdict.

Standard library only: the runner may group by it without importing torch.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from typing import Literal, TypeAlias

from envbuilder.conformance._record import Number

__all__ = [
    "COMPONENTS",
    "Component",
    "Fault",
    "cause_of_problem",
    "decided",
    "error_fault",
    "normalise",
    "problem_fault",
    "raised_in_suite",
]

#: a component the experiments can find at fault (``suite``: the suite's own code)
Component: TypeAlias = Literal["torch", "xformers", "diffusers", "suite"]
#: what a result records as ``fault_component``
Fault: TypeAlias = Literal["torch", "xformers", "diffusers", "suite", "undecided"]
COMPONENTS: tuple[Fault, ...] = ("torch", "xformers", "diffusers", "suite", "undecided")

_OP = re.compile(r"\b(aten|prims|xformers\w*|flash_attn_3)(?:\.|::)([A-Za-z_][A-Za-z0-9_]*)")

#: failures whose text varies but whose reason is one: (pattern, stable name)
_KNOWN: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Unhandled FakeTensor Device Propagation", re.I), "FakeTensor device propagation"),
    (
        re.compile(r"No operator found for `?memory_efficient_attention"),
        "no xformers operator for the inputs",
    ),
    (re.compile(r"no kernel image is available", re.I), "no kernel image for this GPU"),
    (re.compile(r"No available kernel", re.I), "no SDPA kernel for the inputs"),
    (
        re.compile(r"xFormers can't load C\+\+/CUDA extensions", re.I),
        "xformers' extension does not load",
    ),
    (re.compile(r"out of memory", re.I), "out of memory"),
)

_LIMIT = 160


def normalise(text: str) -> str:
    """``text`` without what varies between checks failing for one reason."""
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
    text = re.sub(r'File "[^"]*", line \d+', "", text)
    text = re.sub(r"\b(cuda|xpu|hip):\d+\b", r"\1", text)
    text = re.sub(r"torch\.(float16|bfloat16|float32|float64|half|float|double)\b", "<dtype>", text)
    text = re.sub(r"\b(fp16|bf16|fp32|float16|bfloat16|float32|float64)\b", "<dtype>", text)
    text = re.sub(r"(?<![A-Za-z_])\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    text = re.sub(r"N(\s*[,x×]\s*N)+", "N…", text)
    text = re.sub(
        r"\b(cpu|cuda|meta)((?:\s*,\s*(?:cpu|cuda|meta))+)",
        lambda m: ", ".join(sorted(re.split(r"\s*,\s*", m.group(0)))),
        text,
    )
    return text.strip(" :;,")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its causes, outermost first (each once)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _op_in(text: str) -> str | None:
    match = _OP.search(text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


#: the suite's own modules: an exception raised here is the suite's
_SUITE_DIR = "envbuilder/conformance/"


def _innermost_frame(error: BaseException) -> traceback.FrameSummary | None:
    frames = traceback.extract_tb(error.__traceback__)
    return frames[-1] if frames else None


def raised_in_suite(error: BaseException) -> str | None:
    """Where the suite's own code raised ``error`` (``checks_model.py:205``), or None when it
    came from a library (its innermost frame is not the suite's) or is a CUDA error (those
    surface wherever the host next synchronises, not where they happened)."""
    if any(
        re.search(r"CUDA error|AcceleratorError|device-side assert", str(e)) for e in _chain(error)
    ):
        return None
    frame = _innermost_frame(error)
    filename = frame.filename.replace("\\", "/") if frame is not None else ""
    if frame is None or _SUITE_DIR not in filename:
        return None
    return f"{filename.rsplit('/', 1)[-1]}:{frame.lineno}"


def decided(component: Component, evidence: str) -> dict[str, Number]:
    """The numbers that record an experiment's verdict on who is at fault."""
    return {"fault_component": component, "fault_evidence": evidence[:400]}


def _known(text: str) -> str | None:
    for pattern, name in _KNOWN:
        if pattern.search(text):
            return name
    return None


def error_fault(error: BaseException) -> dict[str, Number]:
    """``cause``, ``fault_op`` (when an error names one) and ``fault_component`` of an
    error: ``suite`` with its place when the suite raised it, else ``undecided``."""
    errors = list(_chain(error))
    texts = [str(e) for e in errors]
    op = next((found for found in map(_op_in, reversed(texts)) if found), None)
    root = errors[-1]
    known = next((name for name in map(_known, texts) if name), None)
    if known is not None:
        cause = f"{known} in {op}" if op else known
    else:
        first = next((line for line in str(root).splitlines() if line.strip()), "")
        cause = f"{type(root).__name__}: {normalise(first)}"
        if op and op not in cause:
            cause += f" in {op}"
    out: dict[str, Number] = {"cause": cause[:_LIMIT], "fault_component": "undecided"}
    if op is not None:
        out["fault_op"] = op
    where = raised_in_suite(error)
    if where is not None:
        out |= decided("suite", f"raised in the suite's own code at {where}")
    return out


def cause_of_problem(problem: str, subject: str) -> str:
    """The cause of a check that ran and found ``problem`` (its first one), about ``subject``
    (what was run: an implementation, a backend, a compiled function)."""
    if problem.startswith("workaround not applied"):
        cause = f"workaround not applied: {subject}"
    elif "cannot tell it from right" in problem:
        cause = f"cannot tell the wrong answer from right: {subject}"
    elif re.search(r"error \S+ > bound", problem):
        cause = f"error above bound: {subject}"
    elif "NaN/inf" in problem:
        cause = f"NaN/inf values: {subject}"
    elif "graph break" in problem:
        reason = problem.split(":", 1)[-1].split("||")[0]
        reason = re.sub(r"^\s*N x ", "", normalise(reason))
        cause = f"graph break ({reason.split(' Explanation')[0]}): {subject}"
    elif "recompile" in problem:
        cause = f"recompiles on shapes already compiled: {subject}"
    elif "versions for" in problem:
        cause = f"more compiled versions than shapes: {subject}"
    else:
        cause = f"{normalise(problem)}: {subject}"
    return cause[:_LIMIT]


def problem_fault(problem: str, subject: str) -> dict[str, Number]:
    """``cause``, ``fault_op`` (when the text names an operator) and ``fault_component``
    ``undecided`` of a check that ran and found ``problem``."""
    out: dict[str, Number] = {
        "cause": cause_of_problem(problem, subject),
        "fault_component": "undecided",
    }
    op = _op_in(problem)
    if op is not None:
        out["fault_op"] = op
    return out
