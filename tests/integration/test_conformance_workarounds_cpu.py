"""Workarounds applied as users apply them, with the evidence that they were, and the
diffusers mask forms, on CPU with a real torch (and diffusers for the masks).

xformers is absent here: the ``dynamo-disable`` machinery runs with SDPA behind the
disable (``inner="sdpa"``), which gives the same evidence a disabled xformers call gives
on a GPU: dynamo's graph break at the call and the kernel run outside the graph."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

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
    outcome = checks_compile.compile_check(
        ctx, "dynamo-disable", "causal", False, True, "fp32", False,
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
FORMS = ("bool2d", "bool4d_b11n", "bool4d_b1mn", "additive")


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
    (instead,) = spec.workarounds
    assert (instead.workaround, instead.impl, instead.covers) == (
        "sdpa-instead",
        "sdpa",
        "masks.xformers.bool4d_b11n.fp32",
    )
    outcome = instead.run()
    assert outcome.status == "pass", outcome.reason
    assert (outcome.numbers["xformers_calls"], outcome.numbers["applied"]) == (0, True)
