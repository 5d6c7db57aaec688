"""The experiments that decide who is at fault for a wrong answer from diffusers' xformers
backend, on CPU: xformers' kernels do not run here, so an honest stand-in (exact attention
in the inputs' dtype) or a planted wrong one takes the kernel's place in diffusers' wrapper,
and the experiments must blame the wrapper for the wrapper's fault and the kernel for the
kernel's, never the kernel for the wrapper's."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

import torch

from envbuilder.conformance import _counterfactual as cf
from envbuilder.conformance import checks_masks as masks
from envbuilder.conformance import checks_model as model
from envbuilder.conformance import plan
from envbuilder.conformance._context import Context

CPU = Context(device="cpu", quick=True)


def honest(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any = None, *a: Any) -> Any:
    """A kernel that is right: exact attention, rounded to the inputs' dtype."""
    return cf.exact_attention(q, k, v, bias, *a)


def drops_the_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any) -> Any:
    """A planted kernel fault: the kernel ignores the bias it is handed."""
    return cf.exact_attention(q, k, v, None)


def _textbook(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> Any:
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias.double()
    return (scores.softmax(-1) @ vh).transpose(1, 2)


def test_the_exact_kernel_honours_a_tensor_bias_and_xformers_bias_objects() -> None:
    from xformers.ops import fmha

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 3, 8, generator=gen, dtype=torch.float16) for _ in range(3))
    bias = torch.randn(2, 3, 6, 6, generator=gen)
    got = cf.exact_attention(q, k, v, bias)
    assert got.dtype == torch.float16
    assert torch.allclose(got.double(), _textbook(q, k, v, bias), atol=1e-3)
    causal = torch.full((6, 6), -math.inf).triu(1)
    got = cf.exact_attention(q, k, v, fmha.attn_bias.LowerTriangularMask())
    assert torch.allclose(got.double(), _textbook(q, k, v, causal), atol=1e-3)
    three = cf.exact_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], None, 0.0, 0.5)
    expected = _textbook(q[:, :, :1], k[:, :, :1], v[:, :, :1], torch.zeros(6, 6) + 0.0)
    assert three.shape == (2, 6, 8)
    scaled = (q[:, :, 0].double() @ k[:, :, 0].double().transpose(-1, -2) * 0.5).softmax(-1)
    assert torch.allclose(three.double(), scaled @ v[:, :, 0].double(), atol=1e-3)
    assert not torch.allclose(three.double(), expected[:, :, 0], atol=1e-3)  # scale was used
    with pytest.raises(ValueError, match="no dropout"):
        cf.exact_attention(q, k, v, None, 0.1)


def test_the_kernel_is_swapped_where_diffusers_looks_it_up_and_put_back() -> None:
    from diffusers.models import attention_dispatch

    scope = vars(attention_dispatch)
    before = scope["xops"]
    with pytest.raises(RuntimeError, match="planted"), cf.kernel_swapped(drops_the_bias):
        assert scope["xops"].memory_efficient_attention is drops_the_bias
        assert scope["xops"].LowerTriangularMask is before.LowerTriangularMask
        raise RuntimeError("planted")
    assert scope["xops"] is before


@pytest.mark.parametrize("n", [13, 16])
def test_the_correct_bias_is_additive_expanded_and_8_aligned(n: int) -> None:
    query, key = torch.zeros(2, 5, 3, 4, dtype=torch.float16), torch.zeros(2, n, 3, 4)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[0, 4:] = False
    bias = cf.correct_bias(keep[:, None, None, :], query, key)
    assert bias.shape == (2, 3, 5, n) and bias.dtype == torch.float16
    assert bias.stride(-2) % 8 == 0
    assert torch.equal(bias == 0, keep[:, None, None, :].expand(2, 3, 5, n))
    assert torch.isneginf(bias[0, :, :, 4:]).all()
    assert torch.equal(cf.correct_bias(keep, query, key), bias)  # a 2-D key mask alike


@pytest.mark.parametrize(
    ("exact", "direct", "component"),
    [
        (cf.Trial(said="fail: out", error=1.0, wrong=True), cf.Trial(said="pass"), "diffusers"),
        (cf.Trial(said="pass"), cf.Trial(said="fail: out", error=1.0, wrong=True), "xformers"),
        (cf.Trial(said="fail: out", error=1.0, wrong=True), cf.Trial(said="could not run here: x"), "undecided"),
        (cf.Trial(said="pass"), cf.Trial(said="pass"), "undecided"),
        (cf.Trial(said="fail: TypeError: x"), cf.Trial(said="pass"), "undecided"),
    ],
)  # fmt: skip
def test_only_agreeing_runs_decide(exact: cf.Trial, direct: cf.Trial, component: str) -> None:
    found = cf.decide(exact, direct)
    assert found["fault_component"] == component
    assert exact.said in str(found["fault_evidence"]) and direct.said in str(
        found["fault_evidence"]
    )


def _number(numbers: Any, key: str) -> float:
    value = numbers[key]
    assert isinstance(value, float), f"{key}: {value!r}"
    return value


def _with_kernel(monkeypatch: pytest.MonkeyPatch, kernel: Any) -> None:
    """``kernel`` standing for xformers' where the experiments call it directly."""
    monkeypatch.setattr(cf, "real_kernel", lambda device: kernel)


def test_diffusers_4d_boolean_conversion_is_blamed_on_diffusers_not_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_kernel(monkeypatch, honest)
    with cf.kernel_swapped(honest):
        got = masks.mask_check(CPU, "xformers", "bool4d_b11n", "fp32")
    numbers = got.numbers
    assert got.status == "fail"
    assert numbers["fault_component"] == "diffusers"
    assert str(numbers["cf_exact_kernel"]).startswith("fail: ")
    assert _number(numbers, "cf_exact_kernel_error") > _number(numbers, "bound")
    assert numbers["cf_direct_kernel"] == "pass"
    assert _number(numbers, "cf_direct_kernel_error") <= _number(numbers, "bound")
    assert numbers["cf_patched_glue"] == "pass"
    assert "_prepare_additive_attn_mask" in str(numbers["upstream_fix"])


def test_a_kernel_fault_inside_a_correct_wrapper_is_blamed_on_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_kernel(monkeypatch, drops_the_bias)
    with cf.kernel_swapped(drops_the_bias):  # diffusers converts a [B,N] mask correctly
        got = masks.mask_check(CPU, "xformers", "bool2d", "fp32")
    assert got.status == "fail"
    assert got.numbers["fault_component"] == "xformers"
    assert got.numbers["cf_exact_kernel"] == "pass"
    assert str(got.numbers["cf_direct_kernel"]).startswith("fail: ")
    assert "upstream_fix" not in got.numbers


def test_without_a_kernel_to_call_directly_the_fault_stays_undecided() -> None:
    with cf.kernel_swapped(honest):
        got = masks.mask_check(CPU, "xformers", "bool4d_b1mn", "fp32")
    numbers = got.numbers
    assert got.status == "fail"
    assert numbers["fault_component"] == "undecided"
    assert str(numbers["cf_direct_kernel"]).startswith("could not run here")
    assert "cf_direct_kernel_error" not in numbers
    assert numbers["cf_patched_glue_kernel"] == "exact float64"
    assert numbers["cf_patched_glue"] == "pass"  # the fix, shown with the exact kernel
    assert "upstream_fix" in numbers


@pytest.mark.parametrize("form", ["bool4d_b11n", "bool4d_b1mn"])
def test_the_mask_handed_in_another_form_means_the_same(form: masks.Form) -> None:
    inp = masks.masked_inputs(CPU, form, torch.float32)
    handed = masks.handed_mask(inp, form, torch.float32)
    if masks.HANDED[form] == "bool2d":
        assert handed.dtype == torch.bool and handed.shape == (inp.case.B, inp.case.N)
        assert torch.equal(handed[:, None, None, :].expand_as(inp.allowed), inp.allowed)
    else:
        assert handed.is_floating_point() and handed.shape == inp.allowed.shape
        assert torch.equal(handed == 0, inp.allowed)
        assert torch.isneginf(handed[~inp.allowed]).all()


@pytest.mark.parametrize("form", ["bool4d_b11n", "bool4d_b1mn"])
def test_the_mask_form_workaround_is_right_and_needs_xformers_to_have_run(form: str) -> None:
    with cf.kernel_swapped(honest):
        got = masks.mask_check(CPU, "xformers", form, "fp32", workaround="mask-form")  # type: ignore[arg-type]
    # right, but the stand-in is no xformers operator: the workaround is not shown applied
    assert got.status == "invalid"
    assert _number(got.numbers, "error") <= _number(got.numbers, "bound")
    assert got.numbers["xformers_calls"] == 0 and got.numbers["applied"] is False
    assert masks.kept_evidence(0)[0] is False
    assert masks.kept_evidence(2) == (
        True,
        "2 xformers operator call(s) in the evidence step (profiler)",
    )


def test_the_specs_cover_the_4d_boolean_forms_with_mask_form_first() -> None:
    gpu = Context(device="cuda:0", quick=False)
    specs = {s.name: s for s in masks.specs(gpu)}
    for name, spec in specs.items():
        assert spec.via == "diffusers"
        kinds = [w.workaround for w in spec.workarounds]
        if name.startswith("masks.xformers.bool4d_"):
            assert kinds == ["mask-form", "sdpa-instead"]
            assert spec.workarounds[0].impl == "xformers"
        elif name.startswith("masks.xformers."):
            assert kinds == ["sdpa-instead"]
        assert all(w.via == "diffusers" for w in spec.workarounds)


def test_the_model_blames_diffusers_for_its_padding_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_kernel(monkeypatch, honest)
    with cf.kernel_swapped(honest):
        got = model.model_check(CPU, "xformers", False, False)
    assert got.status == "fail"
    assert got.numbers["fault_component"] == "diffusers"
    assert got.numbers["cf_direct_kernel"] == "pass"
    assert got.numbers["cf_patched_glue"] == "pass"
    assert got.numbers["cf_mode"] == "eager"


def test_who_is_hit_prompts_of_one_length_are_not_padded_ones_are() -> None:
    with cf.kernel_swapped(honest):
        unpadded = model.who_is_hit(CPU, padded=False)
        padded = model.who_is_hit(CPU, padded=True)
    assert unpadded.status == "pass" and unpadded.numbers["hit"] is False
    assert unpadded.numbers["padded_text_tokens"] == 0
    assert padded.status == "fail" and padded.numbers["hit"] is True
    assert padded.reason.startswith("hit: ")


def test_the_model_reference_starts_from_the_rounded_inputs() -> None:
    inputs = model._inputs(CPU, torch.float16, plan.ALIGNED_TEXT)
    wide = model.reference_inputs(inputs)
    for key in ("hidden_states", "encoder_hidden_states", "timestep"):
        assert wide[key].dtype == torch.float64
        assert torch.equal(wide[key], inputs[key].double())
    assert wide["encoder_hidden_states_mask"] is inputs["encoder_hidden_states_mask"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_mask_checks_reference_starts_from_the_rounded_inputs(dtype: torch.dtype) -> None:
    inp = masks.masked_inputs(CPU, "additive", dtype)
    assert all(t.dtype == dtype for t in (inp.q, inp.k, inp.v, inp.grad))
    assert torch.equal(inp.bias.to(dtype).float(), inp.bias)
