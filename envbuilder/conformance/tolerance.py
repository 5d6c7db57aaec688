"""The tolerance rule for numerical checks, written down once.

Rule: a result computed in a low-precision dtype is compared with the same
computation in float64 (from the same rounded inputs). Its largest absolute
error must be at most

    bound = max(K × error of the plain low-precision math path, FLOOR[dtype])

where the plain math path is the textbook computation done entirely in that
dtype (for attention: ``softmax(q @ kᵀ · scale + bias) @ v`` in fp16/bf16/fp32,
and autograd through it for gradients; for a compiled module: the same module
run eagerly in that dtype). K = 3.

Source: flash-attention's test suite (Dao-AILab/flash-attention,
``tests/test_flash_attn.py``) accepts a kernel when its error against an
fp32 reference is at most 2× the error of PyTorch's own low-precision
implementation; we use a float64 reference and K = 3 for a margin on the
gradients, whose low-precision math path is itself well conditioned. The
absolute floor keeps the rule meaningful when the math path happens to be
nearly exact (small problems): it is about two units in the last place at 1.0
for the half-precision types, and a small multiple of float32's machine
epsilon scaled by reduction length for float32.
Every numerical check records the measured error, the math path's error, the
bound and this rule's name in its ``numbers``.

Compiled on CPU (float32, no GPU: the suite's own CI run): inductor's CPU code
sums float32 in another order than eager PyTorch (vectorised partial sums, fused
reductions) and has no wider type to accumulate in, unlike fp16 on a GPU, where
compiled code computes in float32. Its error is another sample of float32
rounding, and it lies further from the reference than the eager math path's. The
same derivation as K (the largest ratio a correct implementation shows, times a
1.5 margin) gives ``K_CPU_COMPILED``: over ten seeds of the Qwen-Image model
check (torch 2.13.0+cpu, diffusers 0.42.1) the compiled step's error was 1.3-7.5 x
the eager math path's (training: 3.2-7.5; the eager SDPA step: 0.6-1.5), so
7.5 x 1.5 -> 12 (``RULE_CPU_COMPILED``). The nearest plausible wrong answer (the
model without its padding mask) still lies about 10^4-10^5 such bounds away. GPU
bounds keep K.

Sensitivity: a check is only worth something if it can tell a right answer
from a plausible wrong one. Beside its bound each comparison records the
distance from the reference to the nearest plausible wrong answer; when that
is under ``SENSITIVITY_RATIO`` (4) x the bound the check is ``invalid`` (a
failed gate), and its inputs must change until it can see what it checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envbuilder.conformance._record import Number, Outcome

__all__ = [
    "FLOOR",
    "K_CPU_COMPILED",
    "RULE",
    "RULE_CPU_COMPILED",
    "SENSITIVITY_RATIO",
    "Comparison",
    "K",
    "Verdict",
    "assess",
    "bound",
    "compare",
    "factor",
    "judge",
]

K = 3.0
FLOOR: dict[str, float] = {
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 2e-5,
    "float64": 1e-10,
}
RULE = "err <= max(3 x err(low-precision math path), floor[dtype]) vs float64 (flash-attention test convention)"
#: K for a module compiled on CPU in float32 (the docstring's measurement)
K_CPU_COMPILED = 12.0
RULE_CPU_COMPILED = (
    "err <= max(12 x err(eager math path), floor[dtype]) vs float64"
    " (compiled on CPU: inductor's float32 reduction order, 7.5 x measured over 10 seeds x 1.5)"
)


def factor(*, cuda: bool, compiled: bool) -> tuple[float, str]:
    """The factor over the math path's error and the rule's name for a result computed on a
    GPU (``cuda``) or on CPU, ``compiled`` or eagerly: K and RULE but compiled on CPU."""
    if compiled and not cuda:
        return K_CPU_COMPILED, RULE_CPU_COMPILED
    return K, RULE


def bound(math_error: float, dtype: str, *, k: float = K) -> float:
    """The largest error accepted for a result in ``dtype`` whose math path erred by
    ``math_error``, at ``k`` times that error (K but where `factor` says otherwise)."""
    try:
        floor = FLOOR[dtype]
    except KeyError as e:
        raise ValueError(f"no tolerance floor for dtype {dtype!r}; known: {sorted(FLOOR)}") from e
    return max(k * math_error, floor)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One comparison: what was measured and whether it is within the bound."""

    error: float
    math_error: float
    bound: float

    @property
    def ok(self) -> bool:
        # NaN compares False, so a NaN error is never within the bound.
        return self.error <= self.bound

    @property
    def ratio(self) -> float:
        return self.error / self.bound if self.bound > 0 else float("inf")


def judge(error: float, math_error: float, dtype: str) -> Verdict:
    return Verdict(error=error, math_error=math_error, bound=bound(math_error, dtype))


#: a check must be able to see its nearest plausible wrong answer at this many bounds.
SENSITIVITY_RATIO = 4.0


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One compared quantity of a check (an output, a gradient, a statistic).

    ``sensitivity`` is the distance, in the same metric as ``error``, from the
    float64 reference to the nearest plausible wrong answer (the same
    computation without its mask or bias, non-causal for causal, p = 0 for
    dropout, the model without its mask): what a broken implementation could
    plausibly return instead.
    """

    what: str
    error: float
    bound: float
    sensitivity: float
    math_error: float | None = None

    @property
    def ok(self) -> bool:
        return self.error <= self.bound  # NaN compares False

    @property
    def ratio(self) -> float:
        if self.error != self.error:  # NaN: the worst possible
            return math.inf
        return self.error / self.bound if self.bound > 0 else math.inf

    @property
    def sensitivity_ratio(self) -> float:
        return self.sensitivity / self.bound if self.bound > 0 else math.inf


def compare(
    what: str, error: float, math_error: float, dtype: str, sensitivity: float, *, k: float = K
) -> Comparison:
    """A comparison under the tolerance rule: its bound comes from the math path's error
    (``k`` times it: `factor`)."""
    return Comparison(
        what=what,
        error=error,
        bound=bound(math_error, dtype, k=k),
        sensitivity=sensitivity,
        math_error=math_error,
    )


def assess(
    comparisons: Sequence[Comparison],
    *,
    wrong: str,
    problems: Sequence[str] = (),
    numbers: Mapping[str, Number] | None = None,
    rule: str = RULE,
) -> Outcome:
    """A numeric check's outcome from its comparisons (and problems found otherwise).

    ``fail`` when a comparison exceeds its bound or ``problems`` is not empty;
    else ``invalid`` when the worst comparison (largest error / bound) lies
    within ``SENSITIVITY_RATIO`` bounds of the wrong answer ``wrong`` names (the
    check could not have told them apart); else ``pass``. ``numbers`` gets
    ``error``, ``bound``, ``sensitivity`` and ``sensitivity_ratio`` of that
    worst comparison, ``sensitivity_ratio_min`` over all of them, what
    ``wrong`` was and ``rule`` (the one `factor` named for the bounds).
    """
    found = list(problems)
    found += [
        f"{c.what} error {c.error:.3g} > bound {c.bound:.3g}"
        + (f" (math path {c.math_error:.3g})" if c.math_error is not None else "")
        for c in comparisons
        if not c.ok
    ]
    out: dict[str, Number] = dict(numbers or {})
    if not comparisons:
        found = found or ["nothing was compared"]
        return Outcome.failed("; ".join(found), out)
    worst = max(comparisons, key=lambda c: c.ratio)
    out |= {
        "error": worst.error,
        "bound": worst.bound,
        "sensitivity": worst.sensitivity,
        "sensitivity_ratio": round(worst.sensitivity_ratio, 4),
        "sensitivity_ratio_min": round(min(c.sensitivity_ratio for c in comparisons), 4),
        "worst": worst.what,
        "wrong_answer": wrong,
        "rule": rule,
    }
    if worst.math_error is not None:
        out["math_error"] = worst.math_error
    if found:
        return Outcome.failed("; ".join(found), out)
    if not worst.sensitivity_ratio >= SENSITIVITY_RATIO:
        return Outcome.invalid(
            f"{worst.what}: the wrong answer ({wrong}) lies {worst.sensitivity:.3g} from the"
            f" reference, {worst.sensitivity_ratio:.2f} x the bound {worst.bound:.3g}"
            f" (at least {SENSITIVITY_RATIO:g} x needed): this check cannot tell it from right",
            out,
        )
    return Outcome.passed(out)
