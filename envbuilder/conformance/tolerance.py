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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLOOR", "RULE", "K", "Verdict", "bound", "judge"]

K = 3.0
FLOOR: dict[str, float] = {
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 2e-5,
    "float64": 1e-10,
}
RULE = "err <= max(3 x err(low-precision math path), floor[dtype]) vs float64 (flash-attention test convention)"


def bound(math_error: float, dtype: str) -> float:
    """The largest error accepted for a result in ``dtype`` whose math path erred by ``math_error``."""
    try:
        floor = FLOOR[dtype]
    except KeyError as e:
        raise ValueError(f"no tolerance floor for dtype {dtype!r}; known: {sorted(FLOOR)}") from e
    return max(K * math_error, floor)


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
