"""A workaround check counts only with the evidence that it was applied: without it the
check is invalid (it says nothing about the workaround), never a fail or a pass."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from envbuilder.conformance._record import KEEPS_XFORMERS, Outcome
from envbuilder.conformance._workaround import (
    Disabled,
    is_sdpa_op,
    is_xformers_op,
    replaced_evidence,
    settle,
)


@pytest.mark.parametrize(
    ("op", "xformers", "sdpa"),
    [
        ("aten._efficient_attention_forward.default", True, False),
        ("aten::_efficient_attention_backward", True, False),
        ("xformers_flash.flash_fwd.default", True, False),
        ("xformers_flash3::flash_fwd", True, False),
        ("flash_attn_3::fwd", True, False),
        ("aten._scaled_dot_product_efficient_attention.default", False, True),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", False, True),
        ("aten.mm.default", False, False),
    ],
)
def test_operators_are_told_apart(op: str, xformers: bool, sdpa: bool) -> None:
    assert (is_xformers_op(op), is_sdpa_op(op)) == (xformers, sdpa)


@pytest.mark.parametrize(
    ("breaks", "calls", "ops", "missing"),
    [
        (0, 0, 0, "dynamo broke no graph at the disabled call"),
        (1, 0, 0, "never ran outside compiled code"),
        (1, 2, 0, "no xformers operator ran from the disabled function"),
        (0, 2, 1, "dynamo broke no graph at the disabled call"),
    ],
)
@pytest.mark.parametrize("found", ["pass", "fail"])
def test_a_disable_without_its_evidence_is_invalid(
    breaks: int, calls: int, ops: int, missing: str, found: str
) -> None:
    tracker = Disabled(kernel="xformers", calls=calls, ops=ops)
    applied, evidence, numbers = tracker.evidence(breaks)
    run = Outcome.passed({"error": 0.0}) if found == "pass" else Outcome.failed("error 1 > bound 0")
    outcome = settle(run, applied, evidence, numbers)
    assert outcome.status == "invalid"
    assert outcome.reason.startswith("workaround not applied: ")
    assert missing in outcome.reason
    assert outcome.numbers["applied"] is False
    assert outcome.numbers["xformers_calls_outside_graph"] == ops


@pytest.mark.parametrize("found", ["pass", "fail"])
def test_an_applied_disable_keeps_what_the_run_found(found: str) -> None:
    applied, evidence, numbers = Disabled(kernel="xformers", calls=1, ops=2).evidence(1)
    run = Outcome.passed() if found == "pass" else Outcome.failed("out error 1 > bound 0")
    outcome = settle(run, applied, evidence, numbers)
    assert outcome.status == found
    assert outcome.numbers["applied"] is True
    assert outcome.numbers["applied_evidence"] == (
        "1 graph break(s) at the disabled call; 2 xformers operator call(s) outside the"
        " compiled graph in the evidence step"
    )


def test_sdpa_in_xformers_place_must_not_call_xformers() -> None:
    assert replaced_evidence(0)[0] is True
    applied, evidence = replaced_evidence(3)
    outcome = settle(Outcome.passed(), applied, evidence, {"xformers_calls": 3})
    assert outcome.status == "invalid"
    assert outcome.reason == (
        "workaround not applied: 3 xformers operator call(s) in the evidence step"
    )


def test_only_the_disable_keeps_xformers() -> None:
    assert {w for w, keeps in KEEPS_XFORMERS.items() if keeps} == {"dynamo-disable"}
