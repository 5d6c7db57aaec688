"""Attention correctness: xformers' memory-efficient attention and SDPA against float64.

Every numerical comparison follows `envbuilder.conformance.tolerance` (its
docstring states the rule, its source and the sensitivity rule): each check
also measures how far the nearest plausible wrong answer (the mask or bias
dropped, non-causal for causal) lies from the reference, and is ``invalid``
when that is within 4 x its bound.

Forward checks run under ``torch.no_grad`` (inference); backward checks run
forward and backward and compare the gradients of q, k, v and, for a dense
``[B,H,M,N]`` bias, of the bias (training). A failing xformers check is re-run
on the same case with SDPA in xformers' place (workaround ``sdpa-instead``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from functools import partial

import torch

from envbuilder.conformance import _dropout, plan, tolerance
from envbuilder.conformance._attn import (
    DTYPES,
    Case,
    Inputs,
    MaskKind,
    attention_fn,
    is_refusal,
    make_inputs,
    max_abs_error,
    nonfinite,
    run_attention,
    wants_bias_grad,
)
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Impl, Number, Outcome

__all__ = ["MASKS", "base_cases", "specs"]

#: the mask kinds checked for correctness; ``[B,1,M,N]`` as it is has its own check below.
MASKS: tuple[MaskKind, ...] = plan.ATTENTION_MASKS
IMPLS: tuple[Impl, ...] = ("xformers", "sdpa")


def base_cases(ctx: Context) -> list[Case]:
    """The plan's attention cases for this device (`plan.attention_cases`)."""
    return plan.attention_cases(cuda=ctx.is_cuda, quick=ctx.quick)


def grad_out(case: Case, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(case.B, case.M, case.H, case.K, generator=gen, dtype=torch.float64).to(
        device
    )


def compare_attention(
    got: dict[str, torch.Tensor],
    inp: Inputs,
    grad: torch.Tensor | None,
    *,
    bias_grad: bool,
    dtype_name: str,
    problems: list[str],
) -> tuple[list[tolerance.Comparison], str]:
    """Each tensor of ``got`` against float64, with the math path's error and the
    distance of the wrong answer (``Inputs.wrong``) from the reference."""
    mask = inp.case.mask
    ref = run_attention(
        attention_fn("math", mask), "math", inp.to(torch.float64), grad, bias_grad=bias_grad
    )
    low = run_attention(attention_fn("math", mask), "math", inp, grad, bias_grad=bias_grad)
    wrong_inp, wrong = inp.to(torch.float64).wrong()
    off = run_attention(
        attention_fn("math", wrong_inp.case.mask), "math", wrong_inp, grad, bias_grad=bias_grad
    )
    out: list[tolerance.Comparison] = []
    for name, value in got.items():
        bad = nonfinite(value)
        if bad:
            problems.append(f"{name} has {bad} NaN/inf values at {inp.case.label}")
            continue
        out.append(
            tolerance.compare(
                f"{name} at {inp.case.label}",
                max_abs_error(value, ref[name]),
                max_abs_error(low[name], ref[name]),
                dtype_name,
                max_abs_error(off[name], ref[name]),
            )
        )
    return out, wrong


def _sync(ctx: Context) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)


def correctness(
    ctx: Context, impl: Impl, mask: MaskKind, dtype_name: str, backward: bool
) -> Outcome:
    dtype = DTYPES[dtype_name]
    full_dtype = str(dtype).removeprefix("torch.")
    problems: list[str] = []
    unsupported: list[str] = []
    comparisons: list[tolerance.Comparison] = []
    numbers: dict[str, Number] = {"dtype": dtype_name, "mask": mask, "backward": backward}
    wrong = ""
    times: list[float] = []
    fn = attention_fn(impl, mask)
    for i, base in enumerate(base_cases(ctx)):
        case = base.with_mask(mask)
        seeds = plan.ATTENTION_SEEDS.at(i)
        inp = make_inputs(case, dtype, ctx.device, seed=seeds.inputs)
        grad = grad_out(case, ctx.device, seed=seeds.grad) if backward else None
        bias_grad = backward and wants_bias_grad(case)
        try:  # the implementation first: refusals cost no reference computation
            try:
                t0 = time.perf_counter()
                got = run_attention(fn, impl, inp, grad, bias_grad=bias_grad)
                _sync(ctx)
                times.append(time.perf_counter() - t0)
            except (NotImplementedError, RuntimeError) as e:
                if not (bias_grad and is_refusal(e)):
                    raise
                numbers["bias_grad"] = f"not supported, compared without it: {str(e)[:300]}"
                bias_grad = False
                got = run_attention(fn, impl, inp, grad)
        except (NotImplementedError, RuntimeError) as e:
            if not is_refusal(e):
                raise
            unsupported.append(f"{case.label}: {str(e)[:600]}")
            continue
        found, wrong = compare_attention(
            got, inp, grad, bias_grad=bias_grad, dtype_name=full_dtype, problems=problems
        )
        comparisons += found
    numbers["cases"] = len(base_cases(ctx)) - len(unsupported)
    numbers["graph_breaks"] = 0  # eager: nothing is compiled
    if times:
        numbers["step_ms"] = round(statistics.median(times) * 1000, 3)
    if unsupported:
        numbers["unsupported"] = " || ".join(unsupported)[:2000]
        if len(unsupported) == len(base_cases(ctx)):
            problems.append("no kernel accepted any of the inputs: " + unsupported[0][:500])
    return tolerance.assess(comparisons, wrong=wrong, problems=problems, numbers=numbers)


def b1mn_bias(ctx: Context, impl: Impl) -> Outcome:
    """A ``[B,1,M,N]`` bias must be handled correctly or rejected loudly, never silently wrong."""
    dtype_name = "bf16" if ctx.is_cuda else "fp32"
    case = base_cases(ctx)[0].with_mask("bias_b1mn")
    inp = make_inputs(case, DTYPES[dtype_name], ctx.device, seed=plan.B1MN_SEEDS.inputs)
    grad = grad_out(case, ctx.device, seed=plan.B1MN_SEEDS.grad)
    numbers: dict[str, Number] = {"dtype": dtype_name, "case": case.label}
    try:
        got = run_attention(attention_fn(impl, "bias_b1mn"), impl, inp, grad)
    except (NotImplementedError, RuntimeError, ValueError) as e:  # loud: what is asked
        numbers |= {"outcome": "rejected", "message": str(e)[:1000]}
        return Outcome.passed(numbers)
    problems: list[str] = []
    found, wrong = compare_attention(
        got,
        inp,
        grad,
        bias_grad=False,
        dtype_name=str(DTYPES[dtype_name]).removeprefix("torch."),
        problems=problems,
    )
    outcome = tolerance.assess(found, wrong=wrong, problems=problems, numbers=numbers)
    label = {"pass": "handled", "fail": "silently-wrong", "invalid": "unmeasurable"}
    numbers = dict(outcome.numbers) | {"outcome": label[outcome.status]}
    if outcome.status == "fail":
        reason = "a [B,1,M,N] bias is accepted but gives wrong results: " + outcome.reason
        return Outcome.failed(reason, numbers)
    return replace(outcome, numbers=numbers)


def determinism(ctx: Context, impl: Impl) -> Outcome:
    """The forward pass must be bitwise identical on repeat; the backward's is recorded."""
    dtype_name = "bf16" if ctx.is_cuda else "fp32"
    case = base_cases(ctx)[-1].with_mask("causal")
    inp = make_inputs(case, DTYPES[dtype_name], ctx.device, seed=plan.DETERMINISM_SEEDS.inputs)
    grad = grad_out(case, ctx.device, seed=plan.DETERMINISM_SEEDS.grad)
    fn = attention_fn(impl, "causal")
    try:
        runs = [run_attention(fn, impl, inp, grad) for _ in range(3)]
    except (NotImplementedError, RuntimeError) as e:
        if not is_refusal(e):
            raise
        return Outcome.failed(f"no kernel accepted the inputs: {e}", {"case": case.label})
    fwd_same = all(torch.equal(r["out"], runs[0]["out"]) for r in runs[1:])
    bwd_same = all(torch.equal(r[t], runs[0][t]) for r in runs[1:] for t in ("dq", "dk", "dv"))
    numbers: dict[str, Number] = {
        "dtype": dtype_name,
        "case": case.label,
        "repeats": len(runs),
        "forward_bitwise_equal": fwd_same,
        "backward_bitwise_equal": bwd_same,
    }
    if not fwd_same:
        return Outcome.failed("forward output differs between identical runs", numbers)
    return Outcome.passed(numbers)


def large_logits(ctx: Context, impl: Impl) -> Outcome:
    """Inputs whose logits overflow half precision must still give finite results."""
    numbers: dict[str, Number] = {}
    problems: list[str] = []
    case = base_cases(ctx)[0].with_mask("causal")
    fn = attention_fn(impl, "causal")
    for dtype_name in ("fp16", "bf16"):
        seeds = plan.LARGE_LOGITS_SEEDS
        inp = make_inputs(case, DTYPES[dtype_name], ctx.device, seed=seeds.inputs, scale=40.0)
        try:
            got = run_attention(fn, impl, inp, grad_out(case, ctx.device, seed=seeds.grad))
        except (NotImplementedError, RuntimeError) as e:
            if not is_refusal(e):
                raise
            problems.append(f"{dtype_name}: no kernel accepted the inputs: {e}")
            continue
        ref = run_attention(attention_fn("math", "causal"), "math", inp.to(torch.float64), None)
        bad = sum(nonfinite(t) for t in got.values())
        numbers[f"{dtype_name}_nonfinite"] = bad
        numbers[f"{dtype_name}_fwd_error"] = max_abs_error(got["out"], ref["out"])
        if bad:
            problems.append(f"{dtype_name}: {bad} NaN/inf values in output or gradients")
    numbers["case"] = case.label + " q,k scaled by 40"
    return Outcome.judge(problems, numbers)


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    for impl in IMPLS:
        for mask in MASKS:
            for dtype_name in DTYPES:
                for backward in (False, True):
                    spec = CheckSpec(
                        name=f"attention.{impl}.{mask}.{dtype_name}"
                        f".{'backward' if backward else 'forward'}",
                        gate=True,
                        uses=("training",) if backward else ("inference",),
                        impl=impl,
                        run=partial(correctness, ctx, impl, mask, dtype_name, backward),
                        quick=dtype_name != "fp32" or not ctx.is_cuda,
                    )
                    if impl == "xformers":
                        instead = partial(correctness, ctx, "sdpa", mask, dtype_name, backward)
                        spec = replace(
                            spec, workarounds=(spec.covered_by("sdpa-instead", instead, "sdpa"),)
                        )
                    out.append(spec)
        dropout = CheckSpec(
            name=f"attention.{impl}.dropout",
            gate=True,
            uses=("training",),
            impl=impl,
            run=partial(_dropout.dropout_check, ctx, impl, compiled=False),
        )
        if impl == "xformers":
            instead = partial(_dropout.dropout_check, ctx, "sdpa", compiled=False)
            dropout = replace(
                dropout, workarounds=(dropout.covered_by("sdpa-instead", instead, "sdpa"),)
            )
        out.append(dropout)
        for suffix, check in (
            ("bias_b1mn.safe", b1mn_bias),
            ("determinism", determinism),
            ("large_logits", large_logits),
        ):
            out.append(
                CheckSpec(
                    name=f"attention.{impl}.{suffix}",
                    gate=True,
                    uses=("inference", "training"),
                    impl=impl,
                    run=partial(check, ctx, impl),
                )
            )
    return out
