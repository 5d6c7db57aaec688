"""Attention correctness: xformers' memory-efficient attention and SDPA against float64.

Every numerical comparison follows `envbuilder.conformance.tolerance` (its
docstring states the rule and its source).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from envbuilder.conformance import tolerance
from envbuilder.conformance._attn import (
    DTYPES,
    Case,
    Inputs,
    MaskKind,
    Problem,
    make_inputs,
    math_attention,
    max_abs_error,
    nonfinite,
    run_attention,
    sdpa_attention,
    xformers_attention,
)
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Impl, Number, Outcome

__all__ = ["specs"]

MASKS: tuple[MaskKind, ...] = ("none", "causal", "blockdiag", "bias", "bias_expanded")
IMPLS: tuple[Impl, ...] = ("xformers", "sdpa")

AttnFactory = Callable[[Inputs], Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]]


def _factory(impl: Impl) -> AttnFactory:
    return xformers_attention if impl == "xformers" else sdpa_attention


def base_cases(ctx: Context) -> list[Case]:
    """Odd sequence lengths, head dims 32-256, batch > 1; small on CPU and in --quick runs."""
    if not ctx.is_cuda:
        return [Case(B=2, M=37, N=53, H=2, K=32), Case(B=2, M=17, N=17, H=2, K=64)]
    if ctx.quick:
        return [Case(B=2, M=97, N=129, H=4, K=64), Case(B=2, M=257, N=255, H=2, K=128)]
    return [
        Case(B=2, M=37, N=53, H=4, K=32),
        Case(B=3, M=97, N=129, H=4, K=64),
        Case(B=2, M=257, N=255, H=2, K=128),
        Case(B=2, M=129, N=67, H=2, K=256),
    ]


def _grad_out(inp: Inputs, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (inp.case.B, inp.case.M, inp.case.H, inp.case.K)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(inp.q.device)


def _is_unsupported(impl: Impl, error: Exception) -> bool:
    if isinstance(error, Problem):
        return True
    return (
        impl == "sdpa" and isinstance(error, RuntimeError) and "No available kernel" in str(error)
    )


def correctness(ctx: Context, impl: Impl, mask: MaskKind, dtype_name: str) -> Outcome:
    dtype = DTYPES[dtype_name]
    problems: list[str] = []
    unsupported: list[str] = []
    worst: tuple[float, str, tolerance.Verdict] | None = None
    fwd_max = bwd_max = 0.0
    bad_values = 0
    ran = 0
    for i, base in enumerate(base_cases(ctx)):
        case = base.with_mask(mask)
        inp = make_inputs(case, dtype, ctx.device, seed=100 + i)
        grad = _grad_out(inp, seed=200 + i)
        try:  # the implementation first: refusals cost no reference computation
            got = run_attention(_factory(impl), inp, grad)
        except (Problem, RuntimeError) as e:
            if not _is_unsupported(impl, e):
                raise
            unsupported.append(f"{case.label}: {e}")
            continue
        ref = run_attention(math_attention, inp.to(torch.float64), grad)
        low = run_attention(math_attention, inp, grad)
        ran += 1
        for tensor in ("out", "dq", "dk", "dv"):
            bad = nonfinite(got[tensor])
            bad_values += bad
            if bad:
                problems.append(f"{tensor} has {bad} NaN/inf values at {case.label}")
                continue
            verdict = tolerance.judge(
                max_abs_error(got[tensor], ref[tensor]),
                max_abs_error(low[tensor], ref[tensor]),
                str(dtype).removeprefix("torch."),
            )
            if tensor == "out":
                fwd_max = max(fwd_max, verdict.error)
            else:
                bwd_max = max(bwd_max, verdict.error)
            if not verdict.ok:
                problems.append(
                    f"{tensor} error {verdict.error:.3g} > bound {verdict.bound:.3g}"
                    f" (math path {verdict.math_error:.3g}) at {case.label}"
                )
            if worst is None or verdict.ratio > worst[0]:
                worst = (verdict.ratio, f"{tensor} at {case.label}", verdict)
    numbers: dict[str, Number] = {
        "dtype": dtype_name,
        "mask": mask,
        "cases": ran,
        "fwd_max_error": fwd_max,
        "bwd_max_error": bwd_max,
        "nonfinite": bad_values,
        "rule": tolerance.RULE,
    }
    if worst is not None:
        numbers |= {
            "worst": worst[1],
            "worst_error": worst[2].error,
            "worst_math_error": worst[2].math_error,
            "worst_bound": worst[2].bound,
            "worst_ratio": round(worst[0], 4),
        }
    if unsupported:
        numbers["unsupported"] = " || ".join(unsupported)[:2000]
    if ran == 0:
        problems.append("no kernel accepted any of the inputs: " + unsupported[0][:500])
    return Outcome.judge(problems, numbers)


def b1mn_bias(ctx: Context, impl: Impl) -> Outcome:
    """A ``[B,1,M,N]`` bias must be handled correctly or rejected loudly, never silently wrong."""
    dtype_name = "bf16" if ctx.is_cuda else "fp32"
    base = base_cases(ctx)[0]
    inp = make_inputs(base.with_mask("bias_b1mn"), DTYPES[dtype_name], ctx.device, seed=7)
    grad = _grad_out(inp, seed=8)
    ref = run_attention(math_attention, inp.to(torch.float64), grad)
    low = run_attention(math_attention, inp, grad)
    numbers: dict[str, Number] = {"dtype": dtype_name, "case": inp.case.label}
    try:
        got = run_attention(_factory(impl), inp, grad)
    except (Problem, RuntimeError, ValueError) as e:
        numbers |= {"outcome": "rejected", "message": str(e)[:1000]}
        return Outcome.passed(numbers)
    problems: list[str] = []
    for tensor in ("out", "dq", "dk", "dv"):
        verdict = tolerance.judge(
            max_abs_error(got[tensor], ref[tensor]),
            max_abs_error(low[tensor], ref[tensor]),
            str(DTYPES[dtype_name]).removeprefix("torch."),
        )
        numbers[f"{tensor}_error"] = verdict.error
        numbers[f"{tensor}_bound"] = verdict.bound
        if not verdict.ok:
            problems.append(f"{tensor} error {verdict.error:.3g} > bound {verdict.bound:.3g}")
    numbers["outcome"] = "silently-wrong" if problems else "handled"
    numbers["rule"] = tolerance.RULE
    if problems:
        return Outcome.failed(
            "a [B,1,M,N] bias is accepted but gives wrong results: " + "; ".join(problems),
            numbers,
        )
    return Outcome.passed(numbers)


def determinism(ctx: Context, impl: Impl) -> Outcome:
    """The forward pass must be bitwise identical on repeat; the backward's is recorded."""
    dtype_name = "bf16" if ctx.is_cuda else "fp32"
    base = base_cases(ctx)[-1].with_mask("causal")
    inp = make_inputs(base, DTYPES[dtype_name], ctx.device, seed=11)
    grad = _grad_out(inp, seed=12)
    try:
        runs = [run_attention(_factory(impl), inp, grad) for _ in range(3)]
    except Problem as e:
        return Outcome.failed(f"no kernel accepted the inputs: {e}", {"case": base.label})
    fwd_same = all(torch.equal(r["out"], runs[0]["out"]) for r in runs[1:])
    bwd_same = all(torch.equal(r[t], runs[0][t]) for r in runs[1:] for t in ("dq", "dk", "dv"))
    numbers: dict[str, Number] = {
        "dtype": dtype_name,
        "case": base.label,
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
    base = base_cases(ctx)[0].with_mask("causal")
    for dtype_name in ("fp16", "bf16"):
        inp = make_inputs(base, DTYPES[dtype_name], ctx.device, seed=21, scale=40.0)
        try:
            got = run_attention(_factory(impl), inp, _grad_out(inp, seed=22))
        except Problem as e:
            problems.append(f"{dtype_name}: no kernel accepted the inputs: {e}")
            continue
        ref = run_attention(math_attention, inp.to(torch.float64), None)
        bad = sum(nonfinite(t) for t in got.values())
        numbers[f"{dtype_name}_nonfinite"] = bad
        numbers[f"{dtype_name}_fwd_error"] = max_abs_error(got["out"], ref["out"])
        if bad:
            problems.append(f"{dtype_name}: {bad} NaN/inf values in output or gradients")
    numbers["case"] = base.label + " q,k scaled by 40"
    return Outcome.judge(problems, numbers)


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    for impl in IMPLS:
        for mask in MASKS:
            for dtype_name in DTYPES:
                out.append(
                    CheckSpec(
                        name=f"attention.{impl}.{mask}.{dtype_name}",
                        gate=True,
                        impl=impl,
                        run=partial(correctness, ctx, impl, mask, dtype_name),
                        quick=dtype_name != "fp32" or not ctx.is_cuda,
                    )
                )
        for suffix, check in (
            ("bias_b1mn.safe", b1mn_bias),
            ("determinism", determinism),
            ("large_logits", large_logits),
        ):
            out.append(
                CheckSpec(
                    name=f"attention.{impl}.{suffix}",
                    gate=True,
                    impl=impl,
                    run=partial(check, ctx, impl),
                )
            )
    return out
