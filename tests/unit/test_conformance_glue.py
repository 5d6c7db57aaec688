"""The glue isolation decides xformers' fault only from the pattern that proves it: the
operator fails under fake tensors with xformers' arguments, passes with its loose CPU
tensors made 0-dim, and passes eagerly. ``meta`` tensors stand in for CUDA ones here:
torch's meta kernel, like its CUDA kernel, accepts what the fake device rule rejects."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from envbuilder.conformance._glue import (  # noqa: E402
    Captured,
    capture_op_args,
    decide_glue,
    decide_mask_outside,
    isolate_glue,
    loose_cpu_args,
)

DEVICE_RULE = "fail: FakeTensorDeviceMismatchError: found at least two devices, cuda:0 and cpu!"


def _backward_args(philox: Any) -> tuple[Any, ...]:
    """``aten._efficient_attention_backward``'s arguments as xformers 0.0.35 passes them
    (recorded on an H200), on ``meta``: ``philox`` is what it passes as seed and offset."""

    def t(*shape: int, dtype: Any = torch.float16) -> Any:
        return torch.empty(*shape, dtype=dtype, device="meta")

    q, bias, lse = t(2, 128, 4, 64), t(2, 4, 128, 128), t(2, 4, 128, dtype=torch.float32)
    seed, offset = philox(), philox()
    return (q, q, q, q, bias, q, None, None, -1, -1, lse, 0.0, seed, offset, 0, True)


def test_xformers_philox_tensors_are_found_and_decided_as_its_glue() -> None:
    op = torch.ops.aten._efficient_attention_backward.default
    numbers = isolate_glue(Captured(op, _backward_args(lambda: torch.empty(0)), {}))
    assert numbers["cf_glue_args"] == (
        "philox_seed: 1-D float32 cpu tensor (0), philox_offset: 1-D float32 cpu tensor (0)"
    )
    assert str(numbers["cf_fake_xformers_args"]).startswith("fail: ")
    assert (numbers["cf_fake_scalar_philox"], numbers["cf_eager"]) == ("pass", "pass")
    assert numbers["fault_component"] == "xformers"
    assert "xformers' philox_seed and philox_offset" in str(numbers["fault_evidence"])
    assert numbers["upstream_fix"] == (
        "xformers: pass philox_seed and philox_offset to aten._efficient_attention_backward"
        " as 0-dim tensors, as torch's SDPA does"
    )


def test_0_dim_philox_tensors_as_sdpa_passes_them_leave_nothing_to_isolate() -> None:
    op = torch.ops.aten._efficient_attention_backward.default
    numbers = isolate_glue(Captured(op, _backward_args(lambda: torch.tensor(0)), {}))
    assert numbers["cf_fake_xformers_args"] == "pass"
    assert numbers["fault_component"] == "undecided"
    assert "no CPU tensor of more than 0 dimensions" in str(numbers["fault_evidence"])


def _kernel_mixing_devices(
    q: Any, k: Any, v: Any, bias: Any, seed: Any, offset: Any
) -> Any:  # a kernel whose own code puts a CPU tensor beside the inputs' device
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return out + torch.zeros(q.shape[-1])


def test_a_kernel_that_fails_itself_is_not_blamed_on_the_glue() -> None:
    """Planted: the same loose CPU philox tensors, but the SDPA stand-in kernel is what
    fails, under fake tensors whatever the seed's shape and eagerly too."""
    q = torch.empty(2, 4, 16, 8, device="meta")
    args = (q, q, q, None, torch.empty(0), torch.empty(0))
    numbers = isolate_glue(Captured(_kernel_mixing_devices, args, {}))
    assert str(numbers["cf_fake_xformers_args"]).startswith("fail: ")
    assert str(numbers["cf_fake_scalar_philox"]).startswith("fail: ")
    assert str(numbers["cf_eager"]).startswith("fail: ")
    assert numbers["fault_component"] == "undecided"
    assert "0-dim too" in str(numbers["fault_evidence"])
    assert "upstream_fix" not in numbers


RUNS = {
    "cf_glue_op": "aten._efficient_attention_backward.default",
    "cf_fake_xformers_args": DEVICE_RULE,
    "cf_fake_scalar_philox": "pass",
    "cf_eager": "pass",
}


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({}, None),
        ({"cf_eager": "fail: RuntimeError: CUDA error: invalid argument"}, "in eager"),
        ({"cf_eager": "could not run here: no CUDA device"}, "in eager"),
        ({"cf_fake_scalar_philox": DEVICE_RULE}, "0-dim too"),
        ({"cf_fake_xformers_args": "pass"}, "passes under FakeTensorMode"),
        ({"cf_fake_xformers_args": "fail: RuntimeError: shape mismatch"}, "not on the device rule"),
    ],
)
def test_only_the_full_pattern_decides(changed: dict[str, str], why: str | None) -> None:
    decided = decide_glue(RUNS | changed, ["philox_seed", "philox_offset"])
    if why is None:
        assert decided["fault_component"] == "xformers"
        assert "upstream_fix" in decided
    else:
        assert decided["fault_component"] == "undecided"
        assert why in str(decided["fault_evidence"])
        assert "upstream_fix" not in decided


def test_no_loose_argument_decides_nothing() -> None:
    decided = decide_glue(RUNS, [])
    assert decided["fault_component"] == "undecided"


def test_loose_cpu_tensors_are_found_only_beside_another_device() -> None:
    meta = torch.empty(2, 3, device="meta")
    one_d, scalar, wide = torch.empty(0), torch.tensor(0), torch.zeros(4)
    assert loose_cpu_args((meta, one_d, scalar, 0.5, wide, torch.ones(1))) == [1, 5]
    assert loose_cpu_args((torch.empty(2, 3), one_d)) == []


def test_the_operator_call_is_captured_from_an_eager_run() -> None:
    q = torch.randn(1, 2, 8, 4)

    def run() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, q, q)

    captured = capture_op_args(run, "aten._scaled_dot_product_flash_attention_for_cpu")
    assert captured is not None
    assert captured.name.startswith("aten._scaled_dot_product_flash_attention_for_cpu.")
    assert torch.equal(captured.args[0], q) and captured.args[0] is not q
    assert capture_op_args(run, "aten._efficient_attention_backward") is None


@pytest.mark.parametrize(
    ("outside", "component"),
    [("pass", "xformers"), ("fail: error 0.4 > bound 0.01", "undecided")],
)
def test_a_bias_object_is_blamed_only_when_building_it_outside_fixes_it(
    outside: str, component: str
) -> None:
    decided = decide_mask_outside(
        outside, "Unsupported: torch.* op returned non-Tensor", "LowerTriangularMask"
    )
    assert decided["fault_component"] == component
    if component == "xformers":
        assert "LowerTriangularMask constructed inside compiled code" in str(
            decided["fault_evidence"]
        )
    else:
        assert str(decided["fault_evidence"]).endswith(outside)


def test_a_captured_argument_keeps_the_strides_the_kernel_was_handed() -> None:
    """xformers slices its bias from 8-aligned storage; a contiguous copy of it is one the
    kernel refuses in eager ("attn_bias is not correctly aligned"), which would make the
    glue experiment's eager arm fail for a reason of its own."""
    from envbuilder.conformance._glue import _snapshot

    aligned = torch.randn(2, 4, 77, 80)[..., :77]
    copy = _snapshot(aligned)
    assert copy.stride() == aligned.stride() == (24640, 6160, 80, 1)
    assert torch.equal(copy, aligned) and copy.data_ptr() != aligned.data_ptr()


def test_a_captured_expanded_argument_keeps_its_zero_strides() -> None:
    """A bias expanded over heads (stride 0) cannot be copied into with its strides: the
    copy raised "more than one element of the written-to tensor refers to a single memory
    location" on the H200 and left the experiment undecided."""
    from envbuilder.conformance._glue import _snapshot

    expanded = torch.randn(2, 1, 77, 80)[..., :77].expand(2, 4, 77, 77)
    copy = _snapshot(expanded)
    assert copy.stride() == expanded.stride() and torch.equal(copy, expanded)
