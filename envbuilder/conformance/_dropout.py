"""Attention dropout in training mode, checked statistically against p = 0.

With dropout probability p, attention returns ``out = (P ∘ Z / (1 - p)) V`` where
``P`` are the attention probabilities and ``Z`` a Bernoulli(1 - p) mask drawn
independently for every (query row, key). Let ``D = out - O0`` with ``O0 = P V``
the float64 output without dropout, ``e = Z / (1 - p) - 1`` (mean 0, variance
``c = p / (1 - p)``) and, for query row ``i``, ``D_i = Σ_j e_ij P_ij V_j``. Rows draw
independent masks, so over R = B·H·M rows (CLT over the N keys of a row):

* the mean ``m`` of all elements of ``D`` has expectation 0 and variance
  ``Σ_i c Σ_j P_ij² (Σ_k V_jk)² / (R K)²``;
* ``s = Σ D² / E[Σ D²]`` has expectation 1, with ``E[Σ_k D_ik²] = tr Σ_i`` and,
  ``D_i`` being near-Gaussian with covariance ``Σ_i = c Σ_j P_ij² V_j V_jᵀ``,
  ``Var[Σ_k D_ik²] = 2 tr(Σ_i²) = 2 c² Σ_jj' P_ij² P_ij'² (V_j·V_j')²``.

Each statistic must lie within 6 standard deviations of its expectation (a
false failure about once in 10⁹ runs). The nearest plausible wrong answers are
p = 0 (no dropout: ``s = 0``, at distance 1) and, for the mean, dropout without
the ``1/(1 - p)`` rescale (``m = -p · mean(O0)``; ``v`` is offset by 0.5 so that
mean is not zero); the shapes are chosen so both lie at least 4 bounds away.
Two runs after ``torch.manual_seed`` with one seed must give bitwise equal
outputs (both implementations draw the mask from torch's generator), and the
backward pass must run and give finite gradients; gradients are not compared
(the mask they need is not observable).

The ``dynamo-disable`` workaround compiles an attention layer (a projection,
the dropout attention behind ``torch.compiler.disable``, a projection; the
projections are permutations, so the statistics are those of the attention)
and records the evidence that the disable held; the SDPA one records that no
xformers operator ran (`envbuilder.conformance._workaround`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from envbuilder.conformance import _fault, tolerance
from envbuilder.conformance._attn import DTYPES, Case, Inputs, make_inputs, nonfinite
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import Impl, Number, Outcome, Workaround, describe_error
from envbuilder.conformance._workaround import (
    Disabled,
    Kernel,
    projected,
    watching,
    with_evidence,
)

__all__ = ["STD_DEVIATIONS", "P", "dropout_check", "dropout_statistics"]

P = 0.3
STD_DEVIATIONS = 6.0


def _case(ctx: Context) -> tuple[Case, str]:
    if ctx.is_cuda:
        return Case(B=4, M=256, N=256, H=8, K=64), "bf16"
    return Case(B=4, M=128, N=128, H=4, K=32), "fp32"


def _dropout_fn(kernel: Impl, p: float) -> Any:
    def xformers_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        import xformers.ops as xops

        out: torch.Tensor = xops.memory_efficient_attention(q, k, v, p=p)
        return out

    def sdpa_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p
        )
        return out.transpose(1, 2)

    return xformers_fn if kernel == "xformers" else sdpa_fn


def dropout_statistics(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float
) -> list[tolerance.Comparison]:
    """The two comparisons of the module docstring for one output (BMHK tensors)."""
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))
    probs = ((qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])).softmax(-1)
    o0 = probs @ vh
    d = out.double().transpose(1, 2) - o0
    c = p / (1 - p)
    p2 = probs**2
    rows, width = d.shape[0] * d.shape[1] * d.shape[2], d.shape[3]
    var_rowsum = c * (p2 @ vh.sum(-1, keepdim=True) ** 2)  # Var[Σ_k D_ik] per row
    sigma_mean = math.sqrt(float(var_rowsum.sum())) / (rows * width)
    expected_sq = c * (p2 @ (vh**2).sum(-1, keepdim=True))  # tr Σ_i
    gram2 = (vh @ vh.transpose(-1, -2)) ** 2
    var_sq = 2 * c**2 * ((p2 @ gram2) * p2).sum(-1)  # 2 tr(Σ_i²)
    total = float(expected_sq.sum())
    ratio = float((d**2).sum()) / total
    sigma_ratio = math.sqrt(float(var_sq.sum())) / total
    return [
        tolerance.Comparison(
            what="mean of (out - p=0 output)",
            error=abs(float(d.mean())),
            bound=STD_DEVIATIONS * sigma_mean,
            sensitivity=abs(p * float(o0.mean())),
        ),
        tolerance.Comparison(
            what="mean square of (out - p=0 output) / its expectation",
            error=abs(ratio - 1.0),
            bound=STD_DEVIATIONS * sigma_ratio,
            sensitivity=1.0,
        ),
    ]


def dropout_check(
    ctx: Context,
    kernel: Impl,
    *,
    compiled: bool,
    workaround: Workaround | None = None,
    inner: Kernel = "xformers",
) -> Outcome:
    """Dropout (p = 0.3) in training mode, eager or under ``torch.compile``; with
    ``workaround``, that workaround's check (``inner``: the kernel behind the disable)."""
    case, dtype_name = _case(ctx)
    dtype = DTYPES[dtype_name]
    inp = make_inputs(case, dtype, ctx.device, seed=31, v_offset=0.5)
    fn, disabled = _attention(kernel, workaround, inner)
    numbers: dict[str, Number] = {
        "p": P,
        "dtype": dtype_name,
        "case": case.label,
        "compiled": compiled,
    }
    breaks_before = _graph_breaks()
    runner = fn
    if compiled:
        runner = torch.compile(fn, dynamic=False)
    gen = torch.Generator(device="cpu").manual_seed(32)
    grad = torch.randn(case.B, case.M, case.H, case.K, generator=gen).to(ctx.device, dtype)
    seen = _Seen()
    try:
        _repeat(ctx, runner, inp, grad, seen, disabled=disabled, workaround=workaround)
    except Exception as e:  # the kernel or the compiler refusing dropout is the finding
        failed = Outcome.failed(
            f"dropout in training mode failed: {describe_error(e)}",
            numbers | _fault.error_fault(e),
        )
        breaks = _graph_breaks() - breaks_before
        return with_evidence(failed, workaround, disabled, breaks, seen.xformers_calls[0])
    breaks = _graph_breaks() - breaks_before
    outcome = _judged(inp, seen, numbers, breaks)
    if outcome.status == "fail":
        subject = f"{workaround or kernel} dropout{' compiled' if compiled else ''}"
        outcome = Outcome.failed(
            outcome.reason,
            dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject),
        )
    return with_evidence(outcome, workaround, disabled, breaks, seen.xformers_calls[0])


def _attention(
    kernel: Impl, workaround: Workaround | None, inner: Kernel
) -> tuple[Callable[..., torch.Tensor], Disabled | None]:
    """The dropout attention a check runs: ``kernel``'s, or for ``dynamo-disable`` an
    attention layer calling ``inner``'s behind the disable (and that disabled function)."""
    fn = _dropout_fn(kernel, P)
    disabled: Disabled | None = None
    if workaround == "dynamo-disable":
        disabled = Disabled(kernel=inner)
        attention = disabled.wrap(_dropout_fn(inner, P))
        layer = projected(lambda q, k, v, m: attention(q, k, v))

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return layer(q, k, v, None)

    return fn, disabled


@dataclass
class _Seen:
    """What the runs of a dropout check saw, kept as they go (a run that raises leaves what
    came before it)."""

    outs: list[torch.Tensor] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    xformers_calls: list[int] = field(default_factory=lambda: [0])


def _repeat(
    ctx: Context,
    runner: Callable[..., torch.Tensor],
    inp: Inputs,
    grad: torch.Tensor,
    seen: _Seen,
    *,
    disabled: Disabled | None,
    workaround: Workaround | None,
) -> None:
    """Three training steps after ``torch.manual_seed`` with one seed: the first gathers a
    workaround's evidence (untimed for ``step_ms``) and has its gradients checked."""
    for repeat in range(3):
        torch.manual_seed(1234)
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (inp.q, inp.k, inp.v))
        _sync(ctx)
        t0 = time.perf_counter()
        # the first run (untimed for step_ms) gathers the workaround's evidence
        with watching(disabled, workaround, seen.xformers_calls, first=repeat == 0):
            out = runner(q, k, v)
            out.backward(grad)
        _sync(ctx)
        seen.times.append(time.perf_counter() - t0)
        seen.outs.append(out.detach())
        if repeat == 0:
            bad = sum(nonfinite(t.grad) for t in (q, k, v) if t.grad is not None)
            if bad:
                seen.problems.append(f"{bad} NaN/inf values in the gradients")


def _judged(inp: Inputs, seen: _Seen, numbers: dict[str, Number], breaks: int) -> Outcome:
    """The runs judged: bitwise equal under one seed, finite, and the statistics of the
    module docstring within their bounds."""
    outs, problems = seen.outs, seen.problems
    same = all(torch.equal(o, outs[0]) for o in outs[1:])
    numbers |= {
        "same_seed_bitwise_equal": same,
        "graph_breaks": breaks,
        "step_ms": round(statistics.median(seen.times[1:]) * 1000, 3),
    }
    if not same:
        problems.append("two runs after torch.manual_seed with one seed differ")
    if nonfinite(outs[0]):
        problems.append(f"{nonfinite(outs[0])} NaN/inf values in the output")
    comparisons = dropout_statistics(outs[0], inp.q, inp.k, inp.v, P)
    wrong = "p = 0, no dropout (for the mean: no 1/(1-p) rescale)"
    return tolerance.assess(comparisons, wrong=wrong, problems=problems, numbers=numbers)


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def _sync(ctx: Context) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)
