"""Attention under test, its float64 reference and the plain low-precision math path.

Tensors use xformers' layout, ``[batch, seq, heads, head_dim]`` (BMHK); SDPA
calls transpose to ``[batch, heads, seq, head_dim]`` and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from envbuilder.conformance._record import describe_error

__all__ = [
    "DTYPES",
    "Case",
    "Inputs",
    "MaskKind",
    "Problem",
    "make_inputs",
    "math_attention",
    "run_attention",
    "sdpa_attention",
    "xformers_attention",
]

MaskKind = Literal["none", "causal", "blockdiag", "bias", "bias_expanded", "bias_b1mn"]

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


@dataclass(frozen=True, kw_only=True)
class Case:
    """One attention problem's shape. ``seqlens`` is set for block-diagonal masks (batch 1)."""

    B: int
    M: int
    N: int
    H: int
    K: int
    mask: MaskKind = "none"
    seqlens: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        extra = f" seqlens={list(self.seqlens)}" if self.seqlens else ""
        return f"B{self.B} M{self.M} N{self.N} H{self.H} K{self.K} {self.mask}{extra}"

    def with_mask(self, mask: MaskKind) -> Case:
        if mask == "blockdiag":
            lengths = (17, 40, 7) if self.M < 200 else (self.M // 3, self.M // 2, self.M // 7)
            total = sum(lengths)
            return replace(self, B=1, M=total, N=total, mask=mask, seqlens=lengths)
        if mask == "causal":
            return replace(self, N=self.M, mask=mask)
        return replace(self, mask=mask)


@dataclass(frozen=True, kw_only=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None  # additive, already in the inputs' dtype
    case: Case

    def to(self, dtype: torch.dtype) -> Inputs:
        return Inputs(
            q=self.q.to(dtype),
            k=self.k.to(dtype),
            v=self.v.to(dtype),
            bias=None if self.bias is None else self.bias.to(dtype),
            case=self.case,
        )


class Problem(Exception):
    """An implementation refused the inputs (no kernel for them); the message says why."""


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage whose last dimension is padded to a multiple of 8, as xformers requires."""
    n = t.shape[-1]
    padded = (n + 7) // 8 * 8
    buf = torch.empty(*t.shape[:-1], padded, dtype=t.dtype, device=t.device)
    buf[..., :n].copy_(t)
    return buf[..., :n]


def make_inputs(
    case: Case, dtype: torch.dtype, device: str, *, seed: int = 0, scale: float = 1.0
) -> Inputs:
    """Random inputs, rounded to ``dtype`` (so every path starts from the same values)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(
            device=device, dtype=dtype
        )

    q = rand(case.B, case.M, case.H, case.K) * scale
    k = rand(case.B, case.N, case.H, case.K) * scale
    v = rand(case.B, case.N, case.H, case.K)
    bias: torch.Tensor | None = None
    if case.mask == "bias":
        bias = _aligned(rand(case.B, case.H, case.M, case.N))
    elif case.mask in ("bias_b1mn", "bias_expanded"):
        bias = _aligned(rand(case.B, 1, case.M, case.N))
    return Inputs(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), bias=bias, case=case)


def _dense_additive(inp: Inputs, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask as an additive ``[B|1, H|1, M, N]`` tensor in ``dtype``; None when unmasked."""
    case = inp.case
    device = inp.q.device
    if case.mask == "none":
        return None
    if case.mask == "causal":
        allowed = torch.ones(case.M, case.N, dtype=torch.bool, device=device).tril()
    elif case.mask == "blockdiag":
        ids = torch.repeat_interleave(
            torch.arange(len(case.seqlens), device=device),
            torch.tensor(case.seqlens, device=device),
        )
        allowed = ids[:, None] == ids[None, :]
    else:
        assert inp.bias is not None
        return inp.bias.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=device)
    ninf = torch.full((), -math.inf, dtype=dtype, device=device)
    return torch.where(allowed, zero, ninf)[None, None]


def math_attention(
    inp: Inputs,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The textbook computation, done entirely in the inputs' dtype (float64 for the reference)."""
    dtype = inp.q.dtype
    additive = _dense_additive(inp, dtype)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        scores = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        if additive is not None:
            scores = scores + additive
        return (scores.softmax(dim=-1) @ vh).transpose(1, 2)

    return fn


def sdpa_attention(
    inp: Inputs,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    case = inp.case
    mask: torch.Tensor | None = None
    causal = case.mask == "causal"
    if case.mask == "blockdiag":
        dense = _dense_additive(inp, inp.q.dtype)
        assert dense is not None
        mask = dense == 0
    elif case.mask in ("bias", "bias_b1mn"):
        mask = inp.bias
    elif case.mask == "bias_expanded":
        assert inp.bias is not None
        mask = inp.bias.expand(case.B, case.H, case.M, case.N)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=causal,
        )
        return out.transpose(1, 2)

    return fn


def xformers_attention(
    inp: Inputs,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    import xformers.ops as xops
    from xformers.ops import fmha

    case = inp.case
    bias: Any = None
    if case.mask == "causal":
        bias = fmha.attn_bias.LowerTriangularMask()
    elif case.mask == "blockdiag":
        bias = fmha.attn_bias.BlockDiagonalMask.from_seqlens(list(case.seqlens))
    elif case.mask in ("bias", "bias_b1mn"):
        bias = inp.bias
    elif case.mask == "bias_expanded":
        assert inp.bias is not None
        bias = inp.bias.expand(case.B, case.H, case.M, case.N)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        try:
            out: torch.Tensor = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
        except NotImplementedError as e:
            raise Problem(describe_error(e)) from e
        return out

    return fn


def run_attention(
    make_fn: Callable[[Inputs], Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]],
    inp: Inputs,
    grad_out: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Forward (and backward when ``grad_out`` is given); returns out, dq, dk, dv detached."""
    fn = make_fn(inp)
    backward = grad_out is not None
    q, k, v = (t.detach().clone().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))
    out = fn(q, k, v)
    result = {"out": out.detach()}
    if grad_out is not None:
        out.backward(grad_out.to(out.dtype))
        for name, t in (("dq", q), ("dk", k), ("dv", v)):
            assert t.grad is not None
            result[name] = t.grad.detach()
    return result


def max_abs_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max().item())


def nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum().item())
