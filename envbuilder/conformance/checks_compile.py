"""torch.compile around attention: graph breaks, recompiles, and numbers against eager.

A small self-attention module and a pre-norm transformer block, each built on
xformers' memory-efficient attention or on SDPA, are compiled with inductor
(``dynamic=False``/``True``, ``fullgraph`` on/off), run over changing batch
sizes and sequence lengths, then over the same shapes again. A check fails on
a graph break, on more compilations than the shapes explain (or any on the
second pass: recompiling without end), on NaN/inf, or when its output or
gradients are further from a float64 eager run than the tolerance rule allows
(`envbuilder.conformance.tolerance`, with the eager run in the same dtype as
the "math path"). The two field workarounds are separate checks: xformers
wrapped in ``torch._dynamo.disable`` (a graph break by design) and SDPA in
xformers' place.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from envbuilder.conformance import tolerance
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import (
    CheckSpec,
    Impl,
    Number,
    Outcome,
    Workaround,
    describe_error,
)

__all__ = ["specs"]

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def attn_xformers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    import xformers.ops as xops
    from xformers.ops import fmha

    bias = fmha.attn_bias.LowerTriangularMask() if causal else None
    out: torch.Tensor = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
    return out


def attn_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    )
    return out.transpose(1, 2)


def attn_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        m, n = scores.shape[-2:]
        allowed = torch.ones(m, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ vh).transpose(1, 2)


_disabled: dict[str, AttnFn] = {}


def attn_xformers_dynamo_disabled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    if "fn" not in _disabled:
        _disabled["fn"] = torch._dynamo.disable(attn_xformers)
    return _disabled["fn"](q, k, v, causal)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, attn: AttnFn, *, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.attn = attn
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, m, d = x.shape
        q, k, v = self.qkv(x).view(b, m, 3, self.heads, d // self.heads).unbind(2)
        out = self.attn(q, k, v, self.causal)
        result: torch.Tensor = self.proj(out.reshape(b, m, d))
        return result


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, attn: AttnFn) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, attn, causal=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        result: torch.Tensor = x + self.mlp(self.norm2(x))
        return result


def _build(kind: str, dim: int, heads: int, attn: AttnFn) -> nn.Module:
    if kind == "attn":
        return SelfAttention(dim, heads, attn, causal=False)
    return Block(dim, heads, attn)


def _with_attn(model: nn.Module, attn: AttnFn) -> nn.Module:
    clone = copy.deepcopy(model)
    for module in clone.modules():
        if isinstance(module, SelfAttention):
            module.attn = attn
    return clone


def _setting(ctx: Context) -> tuple[int, int, torch.dtype, list[tuple[int, int]]]:
    """Model width, heads, dtype and the (batch, sequence) shapes to run, per device and size."""
    if not ctx.is_cuda:
        return 64, 2, torch.float32, [(2, 24), (3, 40)]
    if ctx.quick:
        return 256, 4, torch.bfloat16, [(2, 64), (3, 96)]
    return 256, 4, torch.bfloat16, [(2, 64), (3, 96), (4, 50), (2, 128)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _step(
    model: Callable[[torch.Tensor], torch.Tensor],
    params: nn.Module,
    x: torch.Tensor,
    g: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Forward and backward; returns output, input grad and the attention's qkv weight grad."""
    params.zero_grad(set_to_none=True)
    xi = x.detach().clone().requires_grad_(True)
    out = model(xi)
    (out.double() * g).sum().backward()
    qkv = next(m for m in params.modules() if isinstance(m, SelfAttention)).qkv.weight
    assert xi.grad is not None and qkv.grad is not None
    return {"out": out.detach(), "dx": xi.grad.detach(), "dqkv_w": qkv.grad.detach()}


def _counting_backend(counter: list[int]) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        counter[0] += 1
        return compile_fx(gm, example_inputs)

    return backend


def _short(error: BaseException) -> str:
    return describe_error(error, limit=1200)


def compile_check(
    ctx: Context,
    attn: str,
    kind: str,
    dynamic: bool,
    fullgraph: bool,
    workaround: Workaround | None,
) -> Outcome:
    key = f"{attn}/{kind}/{dynamic}/{fullgraph}"
    if key in ctx.cache:
        cached: Outcome = ctx.cache[key]
        return cached
    outcome = _compile_check(ctx, attn, kind, dynamic, fullgraph, workaround)
    ctx.cache[key] = outcome
    return outcome


def _compile_check(
    ctx: Context,
    attn: str,
    kind: str,
    dynamic: bool,
    fullgraph: bool,
    workaround: Workaround | None,
) -> Outcome:
    fns: dict[str, AttnFn] = {
        "xformers": attn_xformers,
        "sdpa": attn_sdpa,
        "dynamo-disable": attn_xformers_dynamo_disabled,
    }
    dim, heads, dtype, shapes = _setting(ctx)
    dtype_name = str(dtype).removeprefix("torch.")
    torch.manual_seed(0)
    model = _build(kind, dim, heads, fns[attn]).to(ctx.device, dtype)
    reference = _with_attn(model, attn_math).double()
    gen = torch.Generator(device="cpu").manual_seed(1)
    inputs = [
        (
            torch.randn(b, m, dim, generator=gen).to(ctx.device, dtype),
            torch.randn(b, m, dim, generator=gen, dtype=torch.float64).to(ctx.device),
        )
        for b, m in shapes
    ]
    numbers: dict[str, Number] = {
        "module": kind,
        "dtype": dtype_name,
        "dynamic": dynamic,
        "fullgraph": fullgraph,
        "shapes": " ".join(f"{b}x{m}" for b, m in shapes),
        "rule": tolerance.RULE,
    }
    problems: list[str] = []

    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(model)(inputs[0][0])
    except Exception as e:  # the module does not even run under dynamo's tracing
        return Outcome.failed(f"tracing with torch._dynamo.explain failed: {_short(e)}", numbers)
    breaks = int(explained.graph_break_count)
    reasons = [str(getattr(r, "reason", r)).splitlines()[0] for r in explained.break_reasons]
    numbers["graph_breaks"] = breaks
    numbers["graph_break_reasons"] = " || ".join(reasons)[:1500]
    if breaks and workaround != "dynamo-disable":
        problems.append(f"{breaks} graph break(s): {'; '.join(reasons)[:400]}")

    torch._dynamo.reset()
    counter = [0]
    compiled = torch.compile(
        model, backend=_counting_backend(counter), dynamic=dynamic, fullgraph=fullgraph
    )
    times: list[float] = []
    worst: tuple[float, str] = (0.0, "")
    nonfinite = 0
    try:
        for pass_no in (1, 2):
            for (x, g), (b, m) in zip(inputs, shapes, strict=True):
                _sync(ctx.device)
                t0 = time.perf_counter()
                got = _step(compiled, model, x, g)
                _sync(ctx.device)
                times.append(time.perf_counter() - t0)
                if pass_no == 2:
                    continue
                eager = _step(model, model, x, g)
                ref = _step(reference, reference, x.double(), g)
                for name, value in got.items():
                    bad = int((~torch.isfinite(value)).sum().item())
                    nonfinite += bad
                    if bad:
                        problems.append(f"{name} has {bad} NaN/inf values at {b}x{m}")
                        continue
                    verdict = tolerance.judge(
                        float((value.double() - ref[name]).abs().max().item()),
                        float((eager[name].double() - ref[name]).abs().max().item()),
                        dtype_name,
                    )
                    if not verdict.ok:
                        problems.append(
                            f"{name} error {verdict.error:.3g} > bound {verdict.bound:.3g}"
                            f" (eager {verdict.math_error:.3g}) at {b}x{m}"
                        )
                    if verdict.ratio > worst[0]:
                        worst = (
                            verdict.ratio,
                            f"{name} at {b}x{m}: error {verdict.error:.3g}, bound {verdict.bound:.3g}",
                        )
            if pass_no == 1:
                first_pass_compiles = counter[0]
    except Exception as e:  # a compile failure is this check's finding, not a suite error
        numbers["compilations"] = counter[0]
        return Outcome.failed(f"compiled module failed: {_short(e)}", numbers)
    second_pass_compiles = counter[0] - first_pass_compiles
    graphs = breaks + 1
    allowed = graphs * (2 if dynamic else len(set(shapes)))
    numbers |= {
        "compilations": first_pass_compiles,
        "compilations_allowed": allowed,
        "recompilations_on_seen_shapes": second_pass_compiles,
        "first_call_s": round(times[0], 3),
        "steady_call_ms": round(statistics.median(times[len(shapes) :]) * 1000, 3),
        "nonfinite": nonfinite,
        "worst_ratio": round(worst[0], 4),
        "worst": worst[1],
    }
    if second_pass_compiles:
        problems.append(
            f"recompiled {second_pass_compiles} time(s) on shapes already compiled (recompiles without end)"
        )
    if first_pass_compiles > allowed:
        problems.append(
            f"{first_pass_compiles} compilations for {len(shapes)} shapes"
            f" ({'dynamic' if dynamic else 'static'}; at most {allowed} expected)"
        )
    return Outcome.judge(problems, numbers)


def opcheck_xformers(ctx: Context) -> Outcome:
    """``torch.library.opcheck`` on every xformers operator that attention actually calls."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    seen: dict[Any, tuple[Any, Any]] = {}

    def snapshot(value: Any) -> Any:
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            namespace = getattr(func, "namespace", "")
            if (
                namespace.startswith("xformers") or namespace == "flash_attn_3"
            ) and func not in seen:
                seen[func] = (tree_map(snapshot, args), tree_map(snapshot, kwargs or {}))
            return func(*args, **(kwargs or {}))

    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    for causal in (False, True):
        q, k, v = (
            torch.randn(2, 64, 4, 64, device=ctx.device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        try:
            with Recorder():
                attn_xformers(q, k, v, causal).sum().backward()
        except NotImplementedError as e:
            return Outcome.failed(f"attention itself fails: {_short(e)}", {})
    if not seen:
        return Outcome.passed(
            {"ops": "", "note": "attention called no xformers-registered operator"}
        )
    numbers: dict[str, Number] = {"ops": " ".join(sorted(str(f) for f in seen))}
    problems: list[str] = []
    for func, (args, kwargs) in seen.items():
        try:
            torch.library.opcheck(func, args, kwargs)
            numbers[str(func)] = "ok"
        except Exception as e:  # opcheck raises OpCheckError naming the failing test
            numbers[str(func)] = _short(e)
            problems.append(f"{func}: {_short(e)[:300]}")
    return Outcome.judge(problems, numbers)


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    impls: tuple[Impl, ...] = ("xformers", "sdpa")
    for impl in impls:
        for kind in ("block", "attn"):
            for dynamic in (False, True):
                for fullgraph in (True, False):
                    name = (
                        f"compile.{impl}.{kind}.{'dynamic' if dynamic else 'static'}"
                        f".{'fullgraph' if fullgraph else 'breaks_allowed'}"
                    )
                    out.append(
                        CheckSpec(
                            name=name,
                            gate=True,
                            impl=impl,
                            run=partial(compile_check, ctx, impl, kind, dynamic, fullgraph, None),
                            # --quick keeps the hardest one: the block, dynamic shapes, fullgraph
                            quick=kind == "block" and fullgraph and dynamic,
                        )
                    )
    for dynamic in (False, True):
        label = "dynamic" if dynamic else "static"
        out.append(
            CheckSpec(
                name=f"compile.workaround.dynamo_disable.block.{label}",
                gate=True,
                impl="xformers",
                workaround="dynamo-disable",
                run=partial(
                    compile_check, ctx, "dynamo-disable", "block", dynamic, False, "dynamo-disable"
                ),
                quick=False,  # --quick keeps one workaround: SDPA under compile, below
            )
        )
        out.append(
            CheckSpec(
                name=f"compile.workaround.sdpa.block.{label}",
                gate=True,
                impl="sdpa",
                workaround="sdpa-under-compile",
                run=partial(
                    compile_check, ctx, "sdpa", "block", dynamic, True, "sdpa-under-compile"
                ),
                quick=dynamic,
            )
        )
    out.append(
        CheckSpec(
            name="compile.xformers.opcheck",
            gate=False,
            impl="xformers",
            run=partial(opcheck_xformers, ctx),
        )
    )
    return out
