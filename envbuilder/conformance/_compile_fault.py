"""The experiments that decide who is at fault when a direct xformers compile check fails
(`envbuilder.conformance.checks_compile`): for a bias object, the same attention with the
object built outside and ``fullgraph=True`` (`_glue.decide_mask_outside`); for FakeTensor
device propagation in an ``aten`` operator, that operator alone with the arguments
xformers passed it (`_glue.isolate_glue`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from envbuilder.conformance import _glue, plan
from envbuilder.conformance._attn import (
    BIAS_OBJECTS,
    DTYPES,
    MaskKind,
    attention_fn,
    make_inputs,
    run_attention,
    wants_bias_grad,
)
from envbuilder.conformance._compiled_fn import shapes
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import Number, Outcome, describe_error
from envbuilder.conformance.checks_attention import grad_out

__all__ = ["BIAS_CLASS", "attributed"]

#: the xformers class a bias-object mask kind builds
BIAS_CLASS: dict[MaskKind, str] = {
    "causal": "LowerTriangularMask",
    "blockdiag": "BlockDiagonalMask",
}


def attributed(
    ctx: Context,
    failed: Outcome,
    mask: MaskKind,
    dtype_name: str,
    backward: bool,
    *,
    outside: Callable[[], Outcome],
) -> Outcome:
    """``failed`` (a direct xformers check) with the experiments that apply to its cause
    run and recorded (`_experiments`), their verdict on who is at fault included.
    ``outside`` runs the check's case with the bias object built outside the compiled
    function and ``fullgraph=True``."""
    if failed.numbers.get("fault_component") == "suite":
        return failed
    found = _experiments(ctx, failed, mask, dtype_name, backward, outside)
    return replace(failed, numbers=dict(failed.numbers) | found)


def _experiments(
    ctx: Context,
    failed: Outcome,
    mask: MaskKind,
    dtype_name: str,
    backward: bool,
    outside: Callable[[], Outcome],
) -> dict[str, Number]:
    """The experiments for a failing xformers check: a bias object built outside
    (`_glue.decide_mask_outside`), then, for FakeTensor device propagation in an ``aten``
    operator (the direct check's or the outside run's), the glue isolation. The first to
    decide is the verdict; with none, ``undecided`` says what ran."""
    out: dict[str, Number] = {}
    ran: list[str] = []
    cause = str(failed.numbers.get("cause", ""))
    op = failed.numbers.get("fault_op")
    if mask in BIAS_OBJECTS:
        built_outside = outside()
        said = (
            "pass"
            if built_outside.status == "pass"
            else f"{built_outside.status}: {built_outside.reason[:300]}"
        )
        out["cf_mask_outside_fullgraph"] = said
        verdict = _glue.decide_mask_outside(said, cause, BIAS_CLASS[mask])
        if verdict["fault_component"] != "undecided":
            return out | verdict
        ran.append(str(verdict["fault_evidence"]))
        outside_cause = str(built_outside.numbers.get("cause", ""))
        if outside_cause.startswith("FakeTensor device propagation"):
            cause, op = outside_cause, built_outside.numbers.get("fault_op")
    if cause.startswith("FakeTensor device propagation") and str(op).startswith("aten."):
        runs = _glue_isolation(ctx, mask, dtype_name, backward, str(op))
        out |= runs
        if runs.get("fault_component") not in (None, "undecided"):
            return out
        ran.append(str(runs.get("fault_evidence") or runs.get("cf_glue")))
    evidence = "; ".join(ran) if ran else f"no experiment decides this cause ({cause})"
    return out | {"fault_component": "undecided", "fault_evidence": evidence[:400]}


def _glue_isolation(
    ctx: Context, mask: MaskKind, dtype_name: str, backward: bool, op: str
) -> dict[str, Number]:
    """`_glue.isolate_glue` on the arguments xformers passes ``op`` on this check's case,
    captured in an eager run (xformers' kernels need a CUDA device)."""
    if not ctx.is_cuda:
        return {"cf_glue": "could not run here: xformers' kernels need a CUDA device"}
    case = shapes(ctx, mask, False)[0]
    inp = make_inputs(case, DTYPES[dtype_name], ctx.device, seed=plan.COMPILE_SEEDS.inputs)
    grad = grad_out(case, ctx.device, seed=plan.COMPILE_SEEDS.grad) if backward else None
    bias_grad = backward and wants_bias_grad(case)

    def eager() -> None:
        run_attention(attention_fn("xformers", mask), "xformers", inp, grad, bias_grad=bias_grad)

    try:
        captured = _glue.capture_op_args(eager, op)
    except Exception as e:  # xformers failing eagerly is a finding of its own, recorded
        return {"cf_glue": f"fail: the eager run failed: {describe_error(e, 300)}"}
    if captured is None:
        return {"cf_glue": f"the eager run called no {op}"}
    return _glue.isolate_glue(captured)
