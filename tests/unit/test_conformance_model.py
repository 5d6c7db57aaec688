"""The diffusers model checks: aligned gate inputs, and how the unaligned case is classified."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from envbuilder.conformance import checks_model as model
from envbuilder.conformance import plan
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import Outcome

GPU = Context(device="cuda:0", quick=False)

REJECTION = (
    "NotImplementedError: No operator found for `memory_efficient_attention_forward` with"
    " inputs: | attn_bias   : <class 'torch.Tensor'> | `cutlassF-pt` is not supported because:"
    " | attn_bias.stride(-2) % 8 != 0"
)


def _fake_check(outcome: Outcome, seen: list[dict[str, Any]]) -> Any:
    def check(
        ctx: Context, impl: str, compiled: bool, training: bool, *, text: int = plan.ALIGNED_TEXT
    ) -> Outcome:
        seen.append({"impl": impl, "compiled": compiled, "training": training, "text": text})
        return outcome

    return check


def test_gate_inputs_make_the_joint_sequence_a_multiple_of_8_and_the_info_case_not() -> None:
    image_tokens = plan.IMAGE_SIDE**2
    assert (image_tokens + plan.ALIGNED_TEXT) % 8 == 0
    assert (image_tokens + plan.UNALIGNED_TEXT) % 8 != 0


INFO = {
    "model.diffusers.qwenimage.xformers.unaligned_mask",
    "model.diffusers.qwenimage.xformers.hit.mask_all_true",
    "model.diffusers.qwenimage.xformers.hit.padded",
}


def test_only_the_unaligned_and_who_is_hit_cases_are_info_and_xformers_needs_cuda() -> None:
    specs = {s.name: s for s in model.specs(GPU)}
    assert {n for n, s in specs.items() if not s.gate} == INFO
    assert all({"cuda", "xformers"} <= s.requires for s in specs.values() if s.impl == "xformers")


def test_every_model_check_and_workaround_goes_through_diffusers() -> None:
    specs = model.specs(GPU)
    every = specs + [w for s in specs for w in s.workarounds]
    assert {s.via for s in every} == {"diffusers"}


@pytest.mark.parametrize(
    ("outcome", "status", "label", "reason_part"),
    [
        (Outcome.passed({"joint_tokens": 269, "error": 0.01}), "pass", "handled", ""),
        (Outcome.failed(REJECTION, {"joint_tokens": 269}), "fail", "rejected", "native backend"),
        (
            Outcome.failed(
                "output error 0.5 vs float64 > bound 0.02", {"joint_tokens": 269, "error": 0.5}
            ),
            "fail",
            "silently-wrong",
            "output error 0.5",
        ),
        (
            Outcome.failed(
                "RuntimeError: CUDA error: an illegal memory access", {"joint_tokens": 269}
            ),
            "fail",
            "error",
            "illegal memory access",
        ),
    ],
)
def test_the_unaligned_case_says_what_happened(
    monkeypatch: pytest.MonkeyPatch, outcome: Outcome, status: str, label: str, reason_part: str
) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(model, "model_check", _fake_check(outcome, seen))
    measured = {
        "native_backend": "pass",
        "cf_patched_glue": "pass",
        "upstream_fix": "diffusers: convert",
    }
    monkeypatch.setattr(model, "_unaligned_experiments", lambda ctx: measured)
    got = model.unaligned_mask(GPU)
    assert seen == [
        {"impl": "xformers", "compiled": False, "training": False, "text": plan.UNALIGNED_TEXT}
    ]
    assert got.status == status
    assert got.numbers["outcome"] == label
    assert reason_part in got.reason
    if label == "rejected":
        assert "attn_bias.stride(-2) % 8 != 0" in got.reason  # xformers' own words are kept
        # what was measured to work, never padding the prompt into the silently wrong case
        assert "pad" not in got.reason.replace("padding mask", "")
        assert "multiple of 8" not in got.reason
        assert got.numbers["native_backend"] == "pass"
        assert got.numbers["upstream_fix"] == "diffusers: convert"


class _TwoLayers(torch.nn.Module):
    """``used`` always feeds the output; ``spare`` only when asked, times an exact zero:
    a graph break leaves such a parameter an exact-zero gradient where eager leaves None."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = torch.nn.Linear(4, 3)
        self.spare = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, touch_spare: bool = False) -> tuple[torch.Tensor]:
        out = self.used(x)
        if touch_spare:
            out = out + 0.0 * self.spare(x)
        return (out,)


def _training_step(touch_spare: bool, *, scale_used: float = 1.0) -> Any:
    toy = _TwoLayers()
    with torch.no_grad():
        toy.used.weight.mul_(scale_used)
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1))
    return model._step(toy, toy, {"x": x, "touch_spare": touch_spare}, True)


def test_a_none_gradient_and_an_exact_zero_one_are_the_same_no_gradient() -> None:
    differences = model.step_differences(_training_step(True), _training_step(False))
    assert {name: d.problems for name, d in differences.items()} == {
        "output": (),
        "gradients": (),
        "updated parameters": (),
    }
    assert differences["gradients"].error == 0.0
    assert differences["updated parameters"].error == 0.0


def test_a_parameter_missing_on_one_side_is_a_problem_naming_it() -> None:
    got, expected = _training_step(False), _training_step(False)
    assert got.gradients is not None and got.updated is not None
    del got.gradients["spare.bias"]
    del got.updated["spare.bias"]
    differences = model.step_differences(got, expected)
    assert differences["gradients"].problems == (
        "gradients: parameter spare.bias is missing from the run",
    )
    assert "spare.bias" in differences["updated parameters"].problems[0]


def test_a_shape_mismatch_is_a_problem_naming_the_parameter() -> None:
    got, expected = _training_step(False), _training_step(False)
    assert got.gradients is not None
    got.gradients["used.weight"] = torch.zeros(2, 2)
    (problem,) = model.step_differences(got, expected)["gradients"].problems
    assert "used.weight" in problem and "2x2" in problem and "3x4" in problem


def test_a_real_mismatch_is_measured_and_names_the_worst_parameter() -> None:
    differences = model.step_differences(
        _training_step(False, scale_used=1.5), _training_step(False)
    )
    assert differences["gradients"].problems == ()
    assert differences["updated parameters"].error > 0.01
    assert differences["updated parameters"].worst == "used.weight"
    assert differences["output"].error > 0.01
