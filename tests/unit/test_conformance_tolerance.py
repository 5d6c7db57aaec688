"""The tolerance rule: error vs float64 <= max(K x math-path error, floor[dtype])."""

from __future__ import annotations

import math

import pytest

from envbuilder.conformance import tolerance


@pytest.mark.parametrize(
    ("error", "math_error", "dtype", "ok"),
    [
        (0.010, 0.004, "bfloat16", True),  # floor 1.6e-2 dominates
        (0.030, 0.010, "bfloat16", True),  # 3 x 0.010 = 0.030, inclusive
        (0.031, 0.010, "bfloat16", False),
        (1.9e-3, 1e-4, "float16", True),  # floor 2e-3
        (2.1e-3, 1e-4, "float16", False),
        (1.5e-5, 1e-7, "float32", True),
        (5e-5, 1e-7, "float32", False),
        (math.nan, 1e-3, "float16", False),  # NaN is never within the bound
        (math.inf, 1e-3, "float16", False),
    ],
)
def test_judge_applies_the_rule(error: float, math_error: float, dtype: str, ok: bool) -> None:
    verdict = tolerance.judge(error, math_error, dtype)
    assert verdict.ok is ok
    assert verdict.bound == max(tolerance.K * math_error, tolerance.FLOOR[dtype])


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="'int8'"):
        tolerance.bound(0.1, "int8")


def test_rule_text_names_its_source() -> None:
    assert "flash-attention" in tolerance.RULE
    assert "flash-attention" in (tolerance.__doc__ or "")
