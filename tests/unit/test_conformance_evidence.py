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
    with_evidence,
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


def test_only_the_sdpa_workarounds_replace_xformers() -> None:
    assert {w for w, keeps in KEEPS_XFORMERS.items() if not keeps} == {
        "sdpa-under-compile",
        "sdpa-instead",
    }


#: dynamo's reason for a break at a call to a disabled function, as torch 2.13 words it
NAMED = (
    "1 x Skip calling `torch.compiler.disable()`d function Explanation: Skip calling function"
    " `<function disabled_xformers_attention at 0x7f>` since it was wrapped with"
    " `torch.compiler.disable`"
)
OTHER = NAMED.replace("disabled_xformers_attention", "attention")


@pytest.mark.parametrize(
    ("reasons", "graphs", "missing"),
    [
        (OTHER, 2, "no graph break reason names the disabled function disabled_xformers_attention"),
        ("1 x torch.* op returned non-Tensor", 2, "no graph break reason names the disabled"),
        (NAMED, 0, "no graph was compiled around the disabled call"),
    ],
)
def test_a_disable_needs_its_break_reason_and_a_compiled_graph(
    reasons: str, graphs: int, missing: str
) -> None:
    tracker = Disabled(kernel="xformers", calls=1, ops=2)
    applied, evidence, numbers = tracker.evidence(1, break_reasons=reasons, graphs_compiled=graphs)
    outcome = settle(Outcome.passed(), applied, evidence, numbers)
    assert outcome.status == "invalid"
    assert missing in outcome.reason


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_disable_records_its_cost_and_whether_it_drops_fullgraph(fullgraph: bool) -> None:
    tracker = Disabled(kernel="xformers", calls=1, ops=2)
    outcome = with_evidence(
        Outcome.passed(),
        "dynamo-disable",
        tracker,
        3,
        0,
        break_reasons=NAMED,
        graphs_compiled=2,
        drops_fullgraph=fullgraph,
        graph_breaks_per_call=2.0,
        graph_breaks_per_step=2,
    )
    assert outcome.status == "pass", outcome.reason
    numbers = outcome.numbers
    assert (numbers["drops_fullgraph"], numbers["graph_breaks_per_call"]) == (fullgraph, 2.0)
    assert (numbers["graph_breaks_per_step"], numbers["graphs_compiled"]) == (2, 2)
    evidence = str(numbers["applied_evidence"])
    assert "a reason naming disabled_xformers_attention" in evidence
    assert "costs 2 graph break(s) per call, 2 per step" in evidence
    assert ("drops fullgraph=True" in evidence) is fullgraph


@pytest.mark.parametrize(
    ("workaround", "breaks", "nobreaks", "status"),
    [
        ("dynamo-disable", 1, True, "fail"),
        ("dynamo-disable", 1, False, "pass"),
        ("mask-outside-compile", 2, True, "fail"),
        ("mask-outside-compile", 0, True, "pass"),
    ],
)
def test_a_workaround_that_leaves_the_checks_own_graph_breaks_is_no_fix(
    workaround: str, breaks: int, nobreaks: bool, status: str
) -> None:
    tracker = (
        Disabled(kernel="xformers", calls=1, ops=1) if workaround == "dynamo-disable" else None
    )
    outcome = with_evidence(
        Outcome.passed({"error": 0.0}),
        workaround,
        tracker,
        breaks,
        1,
        break_reasons=NAMED,
        graphs_compiled=1,
        covers_nobreaks=nobreaks,
    )
    assert outcome.status == status, outcome.reason
    assert outcome.numbers["applied"] is True
    if status == "fail":
        assert outcome.reason == f"leaves the check's own failure: {breaks} graph break(s)"
        assert outcome.numbers["cause"] == "workaround leaves the check's own failure: graph breaks"


@pytest.mark.parametrize(
    ("graphs", "calls_in_graph", "missing"),
    [(0, 3, "no graph was compiled"), (1, 0, "no xformers operator ran inside a compiled graph")],
)
def test_a_mask_built_outside_needs_xformers_inside_a_compiled_graph(
    graphs: int, calls_in_graph: int, missing: str
) -> None:
    outcome = with_evidence(
        Outcome.passed(), "mask-outside-compile", None, 0, calls_in_graph, graphs_compiled=graphs
    )
    assert outcome.status == "invalid"
    assert outcome.reason == f"workaround not applied: {missing}"
    assert outcome.numbers["xformers_calls_in_graph"] == calls_in_graph
