"""Speed and memory of xformers' attention against PyTorch's SDPA on the GPU (informational).

Forward and forward+backward times come from CUDA events after warm-up
(median of the repeats, with the 10th and 90th percentiles as the spread);
TFLOP/s counts 4·B·H·M·N·K for the forward (halved for causal) and 2.5× that
for the backward; peak memory is ``max_memory_allocated`` above the inputs.
The grid keeps B·M at 32768 tokens with 16 heads: sequence 1k-16k, head dim
64/128, bf16/fp16. Compile time is the first call of a compiled transformer
block, fresh (``torch._dynamo.reset()``), forward and backward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Impl, Number, Outcome, describe_error

__all__ = ["specs"]

TOKENS = 32768
HEADS = 16


def _grid(quick: bool) -> list[tuple[str, int, int]]:
    if quick:
        return [("bf16", 8192, 128), ("bf16", 2048, 64), ("fp16", 16384, 128)]
    return [
        (dtype, seq, k)
        for dtype in ("bf16", "fp16")
        for seq in (1024, 4096, 8192, 16384)
        for k in (64, 128)
    ]


def _attention(impl: Impl) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    if impl == "xformers":
        import xformers.ops as xops

        def xf(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = xops.memory_efficient_attention(q, k, v)
            return out

        return xf

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.transpose(1, 2)

    return sdpa


def _time(fn: Callable[[], object], repeats: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _stats(prefix: str, times: list[float]) -> dict[str, Number]:
    ordered = sorted(times)
    return {
        f"{prefix}_ms_median": round(statistics.median(ordered), 4),
        f"{prefix}_ms_p10": round(ordered[len(ordered) // 10], 4),
        f"{prefix}_ms_p90": round(ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)], 4),
    }


def attention_speed(ctx: Context, impl: Impl, dtype_name: str, seq: int, head_dim: int) -> Outcome:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    batch = max(1, TOKENS // seq)
    repeats = 10 if ctx.quick else 20
    fn = _attention(impl)
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    q, k, v = (
        torch.randn(
            batch, seq, HEADS, head_dim, device=ctx.device, dtype=dtype, generator=gen
        ).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(ctx.device)
    base = torch.cuda.memory_allocated(ctx.device)

    def fwd_only() -> None:
        with torch.no_grad():
            fn(q, k, v)

    try:
        fwd = _time(fwd_only, repeats)
    except NotImplementedError as e:  # xformers has no kernel for these inputs here
        return Outcome.failed(describe_error(e), {"batch": batch, "seq": seq, "head_dim": head_dim})
    fwd_peak = torch.cuda.max_memory_allocated(ctx.device) - base

    def fwd_bwd() -> None:
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), grad)

    torch.cuda.reset_peak_memory_stats(ctx.device)
    both = _time(fwd_bwd, repeats)
    both_peak = torch.cuda.max_memory_allocated(ctx.device) - base
    flops = 4.0 * batch * HEADS * seq * seq * head_dim
    numbers: dict[str, Number] = {
        "batch": batch,
        "seq": seq,
        "heads": HEADS,
        "head_dim": head_dim,
        "dtype": dtype_name,
        "repeats": repeats,
        **_stats("fwd", fwd),
        **_stats("fwd_bwd", both),
        "fwd_tflops": round(flops / (statistics.median(fwd) * 1e-3) / 1e12, 2),
        "fwd_bwd_tflops": round(3.5 * flops / (statistics.median(both) * 1e-3) / 1e12, 2),
        "fwd_peak_mib": round(fwd_peak / 2**20, 1),
        "fwd_bwd_peak_mib": round(both_peak / 2**20, 1),
    }
    key = f"{dtype_name}/{seq}/{head_dim}"
    if impl == "sdpa":
        ctx.cache[key] = numbers
    elif key in ctx.cache:
        sdpa = ctx.cache[key]
        numbers["sdpa_fwd_ms_median"] = sdpa["fwd_ms_median"]
        numbers["fwd_time_vs_sdpa"] = round(
            float(numbers["fwd_ms_median"] or 0) / float(sdpa["fwd_ms_median"]), 3
        )
        numbers["fwd_bwd_time_vs_sdpa"] = round(
            float(numbers["fwd_bwd_ms_median"] or 0) / float(sdpa["fwd_bwd_ms_median"]), 3
        )
        numbers["fwd_bwd_peak_vs_sdpa"] = round(
            float(numbers["fwd_bwd_peak_mib"] or 0) / max(float(sdpa["fwd_bwd_peak_mib"]), 1e-9), 3
        )
    return Outcome.passed(numbers)


def compile_time(ctx: Context, impl: Impl) -> Outcome:
    from envbuilder.conformance._block import Block, attn_sdpa, attn_xformers

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(1024, 8, attn_xformers if impl == "xformers" else attn_sdpa).to(
        ctx.device, torch.bfloat16
    )
    compiled = torch.compile(model)
    x = torch.randn(4, 1024, 1024, device=ctx.device, dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    compiled(x).sum().backward()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    steady = _time(lambda: compiled(x).sum().backward(), 10)
    eager = _time(lambda: model(x).sum().backward(), 10)
    return Outcome.passed(
        {
            "first_call_s": round(first, 3),
            "compiled_step_ms_median": round(statistics.median(steady), 4),
            "eager_step_ms_median": round(statistics.median(eager), 4),
            "shape": "4x1024x1024 bf16, 8 heads",
        }
    )


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    impls: tuple[Impl, ...] = ("sdpa", "xformers")  # SDPA first: xformers' entries quote it
    full = _grid(quick=False)
    quick = set(_grid(quick=True))
    for dtype_name, seq, k in sorted(set(full) | quick, key=lambda t: (t[0], t[1], t[2])):
        for impl in impls:
            out.append(
                CheckSpec(
                    name=f"performance.{impl}.{dtype_name}.s{seq}.d{k}",
                    gate=False,
                    impl=impl,
                    needs=frozenset({"cuda"}),
                    run=partial(attention_speed, ctx, impl, dtype_name, seq, k),
                    quick=(dtype_name, seq, k) in quick,
                )
            )
    for impl in impls:
        out.append(
            CheckSpec(
                name=f"performance.{impl}.compile_time",
                gate=False,
                impl=impl,
                needs=frozenset({"cuda"}),
                run=partial(compile_time, ctx, impl),
                quick=False,  # the compile checks record each first call's time
            )
        )
    return out
