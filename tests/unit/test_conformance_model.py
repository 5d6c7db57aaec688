"""The diffusers model checks: aligned gate inputs, and how the unaligned case is classified."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from envbuilder.conformance import checks_model as model
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
        ctx: Context, impl: str, compiled: bool, training: bool, *, text: int = model.ALIGNED_TEXT
    ) -> Outcome:
        seen.append({"impl": impl, "compiled": compiled, "training": training, "text": text})
        return outcome

    return check


def test_gate_inputs_make_the_joint_sequence_a_multiple_of_8_and_the_info_case_not() -> None:
    image_tokens = model.IMAGE_SIDE**2
    assert (image_tokens + model.ALIGNED_TEXT) % 8 == 0
    assert (image_tokens + model.UNALIGNED_TEXT) % 8 != 0


def test_only_the_unaligned_case_is_info_and_every_xformers_check_needs_cuda() -> None:
    specs = {s.name: s for s in model.specs(GPU)}
    assert not specs["model.diffusers.qwenimage.xformers.unaligned_mask"].gate
    assert all(s.gate for n, s in specs.items() if not n.endswith("unaligned_mask"))
    assert all({"cuda", "xformers"} <= s.requires for s in specs.values() if s.impl == "xformers")


@pytest.mark.parametrize(
    ("outcome", "status", "label", "reason_part"),
    [
        (Outcome.passed({"joint_tokens": 269, "error": 0.01}), "pass", "handled", ""),
        (Outcome.failed(REJECTION, {"joint_tokens": 269}), "fail", "rejected", "multiple of 8"),
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
    got = model.unaligned_mask(GPU)
    assert seen == [
        {"impl": "xformers", "compiled": False, "training": False, "text": model.UNALIGNED_TEXT}
    ]
    assert got.status == status
    assert got.numbers["outcome"] == label
    assert reason_part in got.reason
    if label == "rejected":
        assert "attn_bias.stride(-2) % 8 != 0" in got.reason  # xformers' own words are kept
