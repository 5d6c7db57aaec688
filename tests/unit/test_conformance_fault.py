"""The component at fault and the cause a failing check records: one cause per reason,
whatever the shapes, dtypes and devices of the check that met it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from envbuilder.conformance._fault import error_fault, normalise, problem_fault

FAKE_TENSOR = (
    "Unhandled FakeTensor Device Propagation for aten._efficient_attention_backward.default,"
    " found two different devices {devices}"
)


def _raised_in(filename: str, error: BaseException) -> BaseException:
    """``error`` raised from a frame of a file called ``filename`` (as a library raises it)."""
    code = compile("def fail(error):\n    raise error\n", filename, "exec")
    scope: dict[str, Callable[[BaseException], None]] = {}
    exec(code, scope)
    try:
        scope["fail"](error)
    except BaseException as e:  # the error under test
        return e
    raise AssertionError("unreachable")


def _wrapped(inner: BaseException) -> BaseException:
    """``inner`` as dynamo reports it: a compiler error raised from it."""
    try:
        try:
            raise inner
        except BaseException as e:
            raise RuntimeError(f"backend='inductor' raised: {e}") from e
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    "devices", ["cuda:0, cpu", "cpu, cuda:0", "cuda:3, cpu"], ids=["gpu-first", "cpu-first", "gpu3"]
)
def test_the_fake_tensor_failure_has_one_cause_and_no_one_is_blamed_from_its_text(
    devices: str,
) -> None:
    error = _wrapped(RuntimeError(FAKE_TENSOR.format(devices=devices)))
    assert error_fault(error) == {
        "cause": "FakeTensor device propagation in aten._efficient_attention_backward",
        "fault_component": "undecided",
        "fault_op": "aten._efficient_attention_backward",
    }


@pytest.mark.parametrize(
    "filename",
    [
        "/venv/lib/python3.12/site-packages/xformers/ops/fmha/dispatch.py",
        "/venv/lib/python3.12/site-packages/diffusers/models/attention_dispatch.py",
        "/venv/lib/python3.12/site-packages/torch/nn/functional.py",
        "/work/check.py",
    ],
)
def test_a_library_raising_is_not_yet_its_fault(filename: str) -> None:
    """Which file raised says where an error surfaced, not who is wrong: only an
    experiment decides that (`_counterfactual`)."""
    error = _raised_in(filename, ValueError("Only 2D and 4D attention masks are supported"))
    found = error_fault(error)
    assert found["fault_component"] == "undecided"
    assert "fault_op" not in found and "fault_evidence" not in found


@pytest.mark.parametrize(
    "filename",
    [
        "/checkout/envbuilder/conformance/checks_model.py",
        "/venv/lib/python3.12/site-packages/envbuilder/conformance/checks_model.py",
    ],
)
def test_an_error_raised_in_the_suite_is_the_suites(filename: str) -> None:
    error = _raised_in(filename, RuntimeError("The size of tensor a (5) must match the size of b"))
    found = error_fault(error)
    assert found["fault_component"] == "suite"
    assert found["fault_evidence"] == "raised in the suite's own code at checks_model.py:2"


def test_a_cuda_error_surfacing_in_the_suite_is_not_the_suites() -> None:
    """CUDA errors are asynchronous: they surface at the suite's next synchronisation."""
    error = _raised_in(
        "/checkout/envbuilder/conformance/checks_model.py",
        RuntimeError("CUDA error: an illegal memory access was encountered"),
    )
    assert error_fault(error)["fault_component"] == "undecided"


def test_an_xformers_operator_is_named_but_not_blamed() -> None:
    error = RuntimeError("xformers_flash.flash_fwd.default: CUDA error: invalid argument")
    assert error_fault(error)["fault_component"] == "undecided"
    assert error_fault(error)["fault_op"] == "xformers_flash.flash_fwd"


def test_shapes_dtypes_and_numbers_do_not_split_a_cause() -> None:
    first = "No operator found for `memory_efficient_attention_forward` with inputs:"
    a = NotImplementedError(f"{first}\n query : shape=(2, 77, 4, 64) (torch.float16)")
    b = NotImplementedError(f"{first}\n query : shape=(3, 141, 4, 64) (torch.bfloat16)")
    assert (
        error_fault(a)["cause"] == error_fault(b)["cause"] == "no xformers operator for the inputs"
    )
    assert normalise("shape [2, 77, 4, 64] on cuda:1 in torch.bfloat16") == normalise(
        "shape [3, 141, 8, 32] on cuda:0 in torch.float16"
    )


@pytest.mark.parametrize(
    ("problem", "cause"),
    [
        (
            "out error 0.46 > bound 0.016 (math path 0.0035)",
            "error above bound: diffusers xformers backend, 4-D boolean mask",
        ),
        (
            "dq error 0.51 > bound 0.002 (math path 0.0004); out error 0.4 > bound 0.002",
            "error above bound: diffusers xformers backend, 4-D boolean mask",
        ),
        (
            "12 NaN/inf values in out",
            "NaN/inf values: diffusers xformers backend, 4-D boolean mask",
        ),
    ],
)
def test_numeric_failures_are_named_by_what_ran(problem: str, cause: str) -> None:
    assert problem_fault(problem, "diffusers xformers backend, 4-D boolean mask") == {
        "cause": cause,
        "fault_component": "undecided",
    }
