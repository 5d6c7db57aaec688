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


def _c(error: float, bound: float, sensitivity: float, what: str = "out") -> tolerance.Comparison:
    return tolerance.Comparison(what=what, error=error, bound=bound, sensitivity=sensitivity)


@pytest.mark.parametrize(
    ("comparisons", "problems", "status"),
    [
        ([_c(0.01, 0.02, 0.5)], (), "pass"),  # sensitivity 25 bounds away
        ([_c(0.01, 0.02, 0.08)], (), "pass"),  # exactly 4 x the bound
        ([_c(0.01, 0.02, 0.079)], (), "invalid"),  # the wrong answer lies within 4 bounds
        ([_c(0.0, 0.02, 0.0)], (), "invalid"),  # the mask changes nothing: cannot tell
        ([_c(0.03, 0.02, 0.01)], (), "fail"),  # over the bound: a failure, whatever else
        ([_c(math.nan, 0.02, 0.5)], (), "fail"),
        ([_c(0.01, 0.02, 0.5)], ("2 graph break(s)",), "fail"),
        ([], (), "fail"),  # nothing compared is no pass
        # the worst comparison (largest error / bound) decides sensitivity
        ([_c(0.001, 0.02, 0.01, "dq"), _c(0.015, 0.02, 0.5, "out")], (), "pass"),
        ([_c(0.015, 0.02, 0.01, "dq"), _c(0.001, 0.02, 0.5, "out")], (), "invalid"),
    ],
)
def test_assess_applies_the_sensitivity_rule(
    comparisons: list[tolerance.Comparison], problems: tuple[str, ...], status: str
) -> None:
    outcome = tolerance.assess(comparisons, wrong="mask dropped", problems=problems)
    assert outcome.status == status
    if status != "pass":
        assert outcome.reason
    if comparisons:
        worst = max(comparisons, key=lambda c: c.ratio)
        numbers = outcome.numbers
        assert numbers["error"] == worst.error or math.isnan(worst.error)
        assert numbers["bound"] == worst.bound
        assert numbers["sensitivity"] == worst.sensitivity
        assert numbers["sensitivity_ratio"] == round(worst.sensitivity / worst.bound, 4)
        assert numbers["wrong_answer"] == "mask dropped"


def test_an_invalid_check_says_what_it_could_not_see() -> None:
    outcome = tolerance.assess([_c(0.001, 0.02, 0.03, "dv at B2")], wrong="causal mask dropped")
    assert outcome.status == "invalid"
    assert "dv at B2" in outcome.reason and "causal mask dropped" in outcome.reason
    assert "1.50 x the bound" in outcome.reason


def test_compare_takes_its_bound_from_the_rule() -> None:
    c = tolerance.compare("out", 0.01, 0.004, "bfloat16", 0.2)
    assert c.bound == tolerance.bound(0.004, "bfloat16") == tolerance.FLOOR["bfloat16"]
    assert c.ok and c.sensitivity_ratio == pytest.approx(0.2 / 0.016)


@pytest.mark.parametrize(
    ("cuda", "compiled", "k"),
    [
        (True, False, tolerance.K),
        (True, True, tolerance.K),  # GPU bounds keep K
        (False, False, tolerance.K),  # eager float32 on CPU: within 0.6-1.5 x, measured
        (False, True, tolerance.K_CPU_COMPILED),
    ],
)
def test_factor_is_k_but_compiled_on_cpu(cuda: bool, compiled: bool, k: float) -> None:
    assert tolerance.factor(cuda=cuda, compiled=compiled)[0] == k
    rule = tolerance.factor(cuda=cuda, compiled=compiled)[1]
    assert rule == (tolerance.RULE_CPU_COMPILED if k != tolerance.K else tolerance.RULE)


#: the compiled Qwen-Image training step on CPU (torch 2.13.0+cpu, diffusers 0.42.1, the
#: plan's seeds): its worst quantity, the gradients, as measured
CPU_COMPILED_GRADIENTS = {"error": 5.39e-5, "math_error": 1.68e-5, "sensitivity": 30.7}


def test_a_compiled_cpu_step_is_judged_by_its_own_bound() -> None:
    measured = CPU_COMPILED_GRADIENTS
    k, rule = tolerance.factor(cuda=False, compiled=True)
    at_k = tolerance.compare(
        "gradients", measured["error"], measured["math_error"], "float32", measured["sensitivity"]
    )
    assert not at_k.ok  # K = 3 fails it by 7 %: inductor sums float32 in another order
    c = tolerance.compare(
        "gradients",
        measured["error"],
        measured["math_error"],
        "float32",
        measured["sensitivity"],
        k=k,
    )
    outcome = tolerance.assess([c], wrong="the model without its padding mask", rule=rule)
    assert outcome.status == "pass", outcome.reason
    assert outcome.numbers["rule"] == tolerance.RULE_CPU_COMPILED
    # the nearest plausible wrong answer still lies 10^5 of the new bounds away
    ratio = outcome.numbers["sensitivity_ratio"]
    assert isinstance(ratio, float) and ratio > 1e5


def test_a_planted_wrong_answer_fails_the_cpu_compiled_bound() -> None:
    measured = CPU_COMPILED_GRADIENTS
    k, rule = tolerance.factor(cuda=False, compiled=True)
    # the model without its padding mask returned as the compiled step's answer
    wrong = tolerance.compare(
        "gradients",
        measured["sensitivity"],
        measured["math_error"],
        "float32",
        measured["sensitivity"],
        k=k,
    )
    outcome = tolerance.assess([wrong], wrong="the model without its padding mask", rule=rule)
    assert outcome.status == "fail" and "gradients error 30.7 > bound" in outcome.reason
    # and so does an answer a hundredth as wrong
    near = tolerance.compare("gradients", 0.307, measured["math_error"], "float32", 30.7, k=k)
    assert not near.ok
