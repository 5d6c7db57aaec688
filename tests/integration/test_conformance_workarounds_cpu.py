"""Workarounds applied as users apply them, with the evidence that they were, and the
diffusers mask forms, on CPU with a real torch (and diffusers for the masks).

xformers is absent here: the ``dynamo-disable`` machinery runs with SDPA behind the
disable (``inner="sdpa"``), which gives the same evidence a disabled xformers call gives
on a GPU: dynamo's graph break at the call and the kernel run outside the graph."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from envbuilder.conformance.plan import FORMS  # torch-free: the suite's plan

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (the tests nox session installs torch==2.13.0)",
)


@pytest.fixture
def ctx() -> Any:
    from envbuilder.conformance._context import Context

    return Context(device="cpu", quick=False)


def test_dynamo_disable_breaks_the_graph_at_the_disabled_call_and_runs_it_eagerly(
    ctx: Any,
) -> None:
    from envbuilder.conformance.checks_compile import compile_check

    outcome = compile_check(
        ctx, "dynamo-disable", "bias", False, True, "fp32", True,
        workaround="dynamo-disable", inner="sdpa",
    )  # fmt: skip
    numbers = outcome.numbers
    assert outcome.status == "pass", outcome.reason
    assert numbers["applied"] is True
    assert isinstance(numbers["graph_breaks"], int) and numbers["graph_breaks"] >= 1
    assert "disable" in str(numbers["graph_break_reasons"])
    assert isinstance(numbers["sdpa_calls_outside_graph"], int)
    assert numbers["sdpa_calls_outside_graph"] >= 1
    assert isinstance(numbers["disabled_calls_eager"], int) and numbers["disabled_calls_eager"] >= 1
    # what the direct check measures, measured the same way
    assert {"error", "bound", "sensitivity_ratio", "step_ms", "compilations"} <= set(numbers)


def test_disable_around_the_compiled_callable_is_not_the_workaround(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old construction, ``torch.compile(disable(attention))``: torch unwraps the
    disable, compiles the attention, and the check is invalid, not a pass or a fail."""
    from envbuilder.conformance import checks_compile

    monkeypatch.setattr(checks_compile, "projected", lambda attention: attention)
    monkeypatch.setattr(checks_compile, "split_fn", lambda mask, call: call)
    outcome = checks_compile.compile_check(
        ctx, "dynamo-disable", "bias", False, True, "fp32", False,
        workaround="dynamo-disable", inner="sdpa",
    )  # fmt: skip
    assert outcome.status == "invalid"
    assert outcome.reason.startswith("workaround not applied: dynamo broke no graph")
    assert outcome.numbers["applied"] is False
    assert outcome.numbers["graph_breaks"] == 0
    assert outcome.numbers["disabled_calls_eager"] == 0
    assert str(outcome.numbers["cause"]).startswith("workaround not applied")


def test_sdpa_under_compile_records_that_no_xformers_operator_ran(ctx: Any) -> None:
    from envbuilder.conformance.checks_compile import compile_check

    outcome = compile_check(
        ctx, "sdpa", "causal", False, True, "fp32", False, workaround="sdpa-under-compile"
    )
    assert outcome.status == "pass", outcome.reason
    assert outcome.numbers["xformers_calls"] == 0
    assert outcome.numbers["applied"] is True


def test_dropout_behind_the_disable_keeps_its_statistics(ctx: Any) -> None:
    from envbuilder.conformance._dropout import dropout_check

    outcome = dropout_check(ctx, "sdpa", compiled=True, workaround="dynamo-disable", inner="sdpa")
    assert outcome.status == "pass", outcome.reason
    assert outcome.numbers["applied"] is True
    assert isinstance(outcome.numbers["graph_breaks"], int) and outcome.numbers["graph_breaks"] >= 1


needs_diffusers = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None, reason="diffusers is not installed"
)


@needs_diffusers
@pytest.mark.parametrize("form", FORMS)
def test_the_native_backend_handles_every_mask_form_and_could_see_it_dropped(
    ctx: Any, form: str
) -> None:
    from envbuilder.conformance.checks_masks import mask_check

    outcome = mask_check(ctx, "native", form, "fp32")  # type: ignore[arg-type]
    assert outcome.status == "pass", outcome.reason
    assert outcome.numbers["wrong_answer"] == "the mask dropped"
    ratio = outcome.numbers["sensitivity_ratio_min"]
    assert isinstance(ratio, float) and ratio >= 4


@pytest.fixture
def bool_mask_as_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers' native backend made to do what 0.42.1's xformers backend does: a 4-D
    boolean mask becomes an additive bias with ``.type_as(query)`` (True -> +1.0)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    native = _AttentionBackendRegistry._backends[AttentionBackendName.NATIVE]

    def planted(query: Any, key: Any, value: Any, attn_mask: Any = None, **kwargs: Any) -> Any:
        if (
            attn_mask is not None
            and attn_mask.ndim == 4
            and attn_mask.dtype.is_floating_point is False
        ):
            attn_mask = attn_mask.type_as(query)
        return native(query, key, value, attn_mask, **kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, AttentionBackendName.NATIVE, planted)


@needs_diffusers
@pytest.mark.usefixtures("bool_mask_as_bias")
@pytest.mark.parametrize(
    ("form", "status"),
    [("bool2d", "pass"), ("bool4d_b11n", "fail"), ("bool4d_b1mn", "fail"), ("additive", "pass")],
)
def test_a_boolean_mask_read_as_a_bias_fails_its_check(ctx: Any, form: str, status: str) -> None:
    from envbuilder.conformance.checks_masks import mask_check

    outcome = mask_check(ctx, "native", form, "fp32")  # type: ignore[arg-type]
    assert outcome.status == status, outcome.reason
    if status == "fail":
        assert "> bound" in outcome.reason
        assert outcome.numbers["cause"] == (
            "error above bound: diffusers native backend, 4-D boolean mask"
        )


@needs_diffusers
def test_the_xformers_backends_checks_are_covered_by_the_native_backend(ctx: Any) -> None:
    from envbuilder.conformance.checks_masks import specs

    checks = {s.name: s for s in specs(ctx)}
    assert sorted(checks) == sorted(
        f"masks.{backend}.{form}.fp32" for backend in ("native", "xformers") for form in FORMS
    )
    spec = checks["masks.xformers.bool4d_b11n.fp32"]
    assert spec.requires == {"cuda", "diffusers", "xformers"}
    assert spec.uses == ("inference", "training")
    form, instead = spec.workarounds  # the cheaper first: a mask form the backend converts
    assert (form.workaround, form.impl, form.covers) == (
        "mask-form",
        "xformers",
        "masks.xformers.bool4d_b11n.fp32",
    )
    assert (instead.workaround, instead.impl, instead.covers) == (
        "sdpa-instead",
        "sdpa",
        "masks.xformers.bool4d_b11n.fp32",
    )
    outcome = instead.run()
    assert outcome.status == "pass", outcome.reason
    assert (outcome.numbers["xformers_calls"], outcome.numbers["applied"]) == (0, True)


needs_xformers_ops = pytest.mark.skipif(
    importlib.util.find_spec("xformers") is None, reason="xformers is not installed"
)


@needs_xformers_ops
@pytest.mark.parametrize("mask", ["causal", "blockdiag"])
def test_a_bias_object_built_inside_fullgraph_code_fails_to_trace_and_outside_traces(
    mask: str,
) -> None:
    """What dynamo does with xformers' bias classes, on CPU as on a GPU (the kernel behind
    them is SDPA here: tracing is what is measured)."""
    import torch

    from envbuilder.conformance._attn import Case, make_inputs, outside_bias, sdpa_on_bias, split_fn

    inp = make_inputs(Case(B=1, M=24, N=24, H=2, K=16).with_mask(mask), torch.float32, "cpu")  # type: ignore[arg-type]
    seqlens = inp.case.seqlens
    torch._dynamo.reset()
    inside = torch.compile(split_fn(mask, sdpa_on_bias), fullgraph=True, backend="eager")  # type: ignore[arg-type]
    with pytest.raises(torch._dynamo.exc.Unsupported):
        inside(inp.q, inp.k, inp.v, seqlens)
    outside = torch.compile(sdpa_on_bias, fullgraph=True, backend="eager")
    assert outside(inp.q, inp.k, inp.v, outside_bias(inp)).shape == inp.q.shape


@needs_xformers_ops
@pytest.mark.parametrize("mask", ["causal", "blockdiag"])
def test_the_mask_outside_experiment_blames_the_bias_object_built_inside(
    ctx: Any, mask: str
) -> None:
    from envbuilder.conformance.checks_compile import compile_check

    outcome = compile_check(ctx, "xformers", mask, False, True, "fp32", True, inner="sdpa")  # type: ignore[arg-type]
    assert outcome.status == "fail"
    assert outcome.numbers["cf_mask_outside_fullgraph"] == "pass"
    assert outcome.numbers["fault_component"] == "xformers"
    bias_class = {"causal": "LowerTriangularMask", "blockdiag": "BlockDiagonalMask"}[mask]
    assert f"its {bias_class} constructed inside compiled code" in str(
        outcome.numbers["fault_evidence"]
    )


@pytest.fixture
def kernel_ignoring_causal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the kernel behind xformers' attention code drops the causal mask."""
    from envbuilder.conformance import _attn, checks_compile

    def wrong(q: Any, k: Any, v: Any, bias: Any) -> Any:
        return _attn.sdpa_on_bias(q, k, v, None)

    monkeypatch.setattr(checks_compile, "sdpa_on_bias", wrong)


@needs_xformers_ops
@pytest.mark.usefixtures("kernel_ignoring_causal")
def test_a_wrong_kernel_is_not_blamed_on_the_bias_object(ctx: Any) -> None:
    """The direct check (mask built inside, nobreaks) fails; built outside it still fails
    (the kernel is wrong), so the experiment decides nothing."""
    from envbuilder.conformance.checks_compile import compile_check

    outcome = compile_check(ctx, "xformers", "causal", False, False, "fp32", False, inner="sdpa")
    assert outcome.status == "fail"
    assert str(outcome.numbers["cf_mask_outside_fullgraph"]).startswith("fail: ")
    assert "> bound" in str(outcome.numbers["cf_mask_outside_fullgraph"])
    assert outcome.numbers["fault_component"] == "undecided"
    assert "mask built outside, fullgraph=True: fail" in str(outcome.numbers["fault_evidence"])


@needs_xformers_ops
@pytest.mark.parametrize("mask", ["causal", "blockdiag"])
@pytest.mark.parametrize("fullgraph", [True, False])
def test_the_mask_built_outside_keeps_the_checks_fullgraph_with_no_break(
    ctx: Any, mask: str, fullgraph: bool
) -> None:
    from envbuilder.conformance.checks_compile import compile_check

    outcome = compile_check(
        ctx, "mask-outside-compile", mask, True, fullgraph, "fp32", True,  # type: ignore[arg-type]
        workaround="mask-outside-compile", inner="sdpa",
    )  # fmt: skip
    numbers = outcome.numbers
    assert outcome.status == "pass", outcome.reason
    assert (numbers["applied"], numbers["graph_breaks"], numbers["fullgraph"]) == (
        True,
        0,
        fullgraph,
    )
    assert isinstance(numbers["sdpa_calls_in_graph"], int) and numbers["sdpa_calls_in_graph"] >= 1


@needs_xformers_ops
@pytest.mark.parametrize(
    ("mask", "built_inside"),
    [
        ("causal", "torch.* op returned non-Tensor"),
        ("blockdiag", "Attempted to call function marked as skipped"),
        ("padding", None),
    ],
)
def test_dynamo_disable_builds_the_mask_in_compiled_code_and_says_what_it_costs(
    ctx: Any, mask: str, built_inside: str | None
) -> None:
    from envbuilder.conformance.checks_compile import compile_check

    def run(fullgraph: bool) -> Any:
        return compile_check(
            ctx, "dynamo-disable", mask, False, fullgraph, "fp32", True,  # type: ignore[arg-type]
            workaround="dynamo-disable", inner="sdpa",
        )  # fmt: skip

    fullgraph = run(True)
    numbers = fullgraph.numbers
    assert fullgraph.status == "pass", fullgraph.reason
    assert numbers["drops_fullgraph"] is True
    assert "drops fullgraph=True" in str(numbers["applied_evidence"])
    assert "a reason naming disabled_sdpa_attention" in str(numbers["applied_evidence"])
    per_call = numbers["graph_breaks_per_call"]
    assert isinstance(per_call, float) and per_call >= (2 if built_inside else 1)
    if built_inside is not None:  # the mask's construction breaks the graph too
        assert built_inside in str(numbers["graph_break_reasons"])
    nobreaks = run(False)
    assert nobreaks.status == "fail"
    assert nobreaks.numbers["drops_fullgraph"] is False
    breaks = nobreaks.numbers["graph_breaks"]
    assert nobreaks.reason.startswith(f"leaves the check's own failure: {breaks} graph break(s)")
