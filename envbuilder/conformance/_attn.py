"""Attention under test, its float64 reference, the plain low-precision math path,
and the nearest plausible wrong answer a check must be able to tell apart.

Tensors use xformers' layout, ``[batch, seq, heads, head_dim]`` (BMHK); SDPA
calls transpose to ``[batch, heads, seq, head_dim]`` and back.

Every implementation is a function ``fn(q, k, v, mask_input)`` that builds its
mask *inside* (so that under ``torch.compile`` the mask is built in the
compiled code, as a model's forward builds it): ``mask_input`` is what a
training loop hands the model for that mask kind (``mask_input``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

import torch

from envbuilder.conformance.plan import DTYPE_NAMES, MASKS, Case, MaskKind

__all__ = [
    "BIAS_OBJECTS",
    "DTYPES",
    "MASKS",
    "AttnFn",
    "Case",
    "Inputs",
    "MaskKind",
    "Problem",
    "attention_fn",
    "is_refusal",
    "make_inputs",
    "mask_input",
    "math_fn",
    "max_abs_error",
    "nonfinite",
    "outside_bias",
    "run_attention",
    "sdpa_on_bias",
    "split_fn",
    "xformers_bias",
    "xformers_call",
]

#: the implementation a function stands for; ``math`` is the textbook computation.
Kernel = Literal["xformers", "sdpa", "math"]
AttnFn: TypeAlias = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, torch_name) for name, torch_name in DTYPE_NAMES.items()
}


@dataclass(frozen=True, kw_only=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None  # additive, in the inputs' dtype, rows 8-aligned in storage
    keep: torch.Tensor | None  # padding: bool [B, N], True for keys attention may see
    case: Case

    def to(self, dtype: torch.dtype) -> Inputs:
        return replace(
            self,
            q=self.q.to(dtype),
            k=self.k.to(dtype),
            v=self.v.to(dtype),
            bias=None if self.bias is None else _aligned(self.bias.to(dtype)),
        )

    def wrong(self) -> tuple[Inputs, str]:
        """The nearest plausible wrong answer's inputs, and what it is.

        A mask or bias dropped (a zero bias, a padding mask keeping every key,
        no block structure); non-causal for causal; causal for no mask.
        """
        mask = self.case.mask
        if mask == "none":
            return replace(self, case=replace(self.case, mask="causal")), "causal"
        if mask in ("causal", "blockdiag"):
            return replace(self, case=replace(self.case, mask="none")), f"{mask} mask dropped"
        if mask == "padding":
            assert self.keep is not None
            return replace(self, keep=torch.ones_like(self.keep)), "padding mask dropped"
        assert self.bias is not None
        return replace(self, bias=_aligned(torch.zeros_like(self.bias))), "bias dropped"


class Problem(Exception):
    """An implementation refused the inputs (no kernel for them); the message says why."""


def is_refusal(error: BaseException) -> bool:
    """Whether an error (raised eagerly or through the compiler) is an implementation
    turning its inputs down: xformers' "No operator found", SDPA's "No available kernel"."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen)
        if (
            isinstance(seen, Problem)
            or "No operator found" in text
            or "No available kernel" in text
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage whose last dimension is padded to a multiple of 8, as xformers requires."""
    n = t.shape[-1]
    padded = (n + 7) // 8 * 8
    buf = torch.zeros(*t.shape[:-1], padded, dtype=t.dtype, device=t.device)
    buf[..., :n].copy_(t)
    return buf[..., :n]


def make_inputs(
    case: Case,
    dtype: torch.dtype,
    device: str,
    *,
    seed: int = 0,
    scale: float = 1.0,
    v_offset: float = 0.0,
) -> Inputs:
    """Random inputs, rounded to ``dtype`` (so every path starts from the same values)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(
            device=device, dtype=dtype
        )

    q = rand(case.B, case.M, case.H, case.K) * scale
    k = rand(case.B, case.N, case.H, case.K) * scale
    v = rand(case.B, case.N, case.H, case.K) + v_offset
    bias: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    if case.mask == "bias":
        bias = _aligned(rand(case.B, case.H, case.M, case.N))
    elif case.mask in ("bias_b1mn", "bias_expanded"):
        bias = _aligned(rand(case.B, 1, case.M, case.N))
    elif case.mask == "padding":
        keep = torch.ones(case.B, case.N, dtype=torch.bool, device=device)
        for b in range(case.B):
            keep[b, case.N - case.padded(b) :] = False
    return Inputs(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), bias=bias, keep=keep, case=case)


def mask_input(kernel: Kernel, inp: Inputs) -> Any:
    """What the training loop hands ``kernel``'s attention for ``inp``'s mask kind."""
    case = inp.case
    if case.mask == "blockdiag":
        if kernel == "xformers":
            return case.seqlens  # BlockDiagonalMask.from_seqlens takes the lengths
        return torch.repeat_interleave(  # segment ids, as packed-batch collators give them
            torch.arange(len(case.seqlens), device=inp.q.device),
            torch.tensor(case.seqlens, device=inp.q.device),
        )
    if case.mask == "padding":
        return inp.keep
    if case.mask in ("bias", "bias_b1mn", "bias_expanded"):
        return inp.bias
    return None


def _padding_bias(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B,1,1,N]``: 0 where a key is kept, the dtype's lowest value where it is padding
    (transformers' ``_prepare_4d_attention_mask`` and diffusers build it so)."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
        ~keep, torch.finfo(dtype).min
    )[:, None, None, :]


def _sdpa(mask: MaskKind) -> AttnFn:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: Any) -> torch.Tensor:
        b, n, h = k.shape[0], k.shape[1], q.shape[2]
        attn_mask: torch.Tensor | None = None
        if mask == "blockdiag":
            attn_mask = m[:, None] == m[None, :]
        elif mask in ("bias", "bias_b1mn"):
            attn_mask = m
        elif mask == "bias_expanded":
            attn_mask = m.expand(b, h, q.shape[1], n)
        elif mask == "padding":
            attn_mask = _padding_bias(m, q.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            is_causal=mask == "causal",
        )
        return out.transpose(1, 2)

    return fn


#: mask kinds whose xformers mask is a bias object (``LowerTriangularMask``,
#: ``BlockDiagonalMask``), not a tensor: what ``mask-outside-compile`` builds outside
BIAS_OBJECTS: tuple[MaskKind, ...] = ("causal", "blockdiag")


def xformers_bias(mask: MaskKind, q: torch.Tensor, k: torch.Tensor, m: Any) -> Any:
    """The ``attn_bias`` xformers' attention takes for ``mask``, built from the training
    loop's mask input ``m`` (in the caller's code: compiled code builds it compiled)."""
    b, n, h = k.shape[0], k.shape[1], q.shape[2]
    if mask == "causal":
        from xformers.ops import fmha

        return fmha.attn_bias.LowerTriangularMask()
    if mask == "blockdiag":
        from xformers.ops import fmha

        return fmha.attn_bias.BlockDiagonalMask.from_seqlens(list(m))
    if mask in ("bias", "bias_b1mn"):
        return m
    if mask == "bias_expanded":
        return m.expand(b, h, q.shape[1], n)
    if mask == "padding":
        # rows start on 8-element boundaries in storage, as xformers' kernels need
        width = (n + 7) // 8 * 8
        buf = torch.zeros(b, 1, 1, width, dtype=q.dtype, device=q.device)
        buf[..., :n] = _padding_bias(m, q.dtype)
        return buf[..., :n].expand(b, h, q.shape[1], n)
    return None


def xformers_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any) -> torch.Tensor:
    """xformers' attention with a ready ``attn_bias``."""
    import xformers.ops as xops

    out: torch.Tensor = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
    return out


def sdpa_on_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any) -> torch.Tensor:
    """SDPA taking what xformers takes (a bias object or tensor): xformers' stand-in where
    its kernels cannot run (on a CPU), so that what is built around the call is tested."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    attn_mask: torch.Tensor | None = None
    causal = False
    if isinstance(bias, torch.Tensor):
        attn_mask = bias
    elif bias is not None:
        from xformers.ops import fmha

        causal = isinstance(bias, fmha.attn_bias.LowerTriangularMask)
        if isinstance(bias, fmha.attn_bias.BlockDiagonalMask):
            starts = bias.q_seqinfo.seqstart.to(q.device)
            position = torch.arange(q.shape[1], device=q.device)
            segment = torch.bucketize(position, starts[1:], right=True)
            attn_mask = segment[:, None] == segment[None, :]
        elif not causal:
            raise TypeError(f"no SDPA form for the bias {type(bias).__name__}")
    out = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=attn_mask, is_causal=causal
    )
    return out.transpose(1, 2)


def split_fn(mask: MaskKind, call: AttnFn) -> AttnFn:
    """xformers' attention as a model writes it: the bias built here (compiled where this
    is compiled), then ``call`` (xformers' attention, or that call behind a disable)."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: Any) -> torch.Tensor:
        return call(q, k, v, xformers_bias(mask, q, k, m))

    return fn


def _xformers(mask: MaskKind) -> AttnFn:
    return split_fn(mask, xformers_call)


def outside_bias(inp: Inputs) -> Any:
    """The bias object of ``inp``'s mask kind, built by the caller outside compiled code
    and passed in (``mask-outside-compile``): causal from the module-level mask, block-
    diagonal from the batch's sequence lengths, as a collator would build it."""
    if inp.case.mask == "causal":
        return _causal_mask()
    if inp.case.mask == "blockdiag":
        from xformers.ops import fmha

        return fmha.attn_bias.BlockDiagonalMask.from_seqlens(list(inp.case.seqlens))
    raise ValueError(f"no bias object for the {inp.case.mask!r} mask")


@functools.cache
def _causal_mask() -> Any:
    from xformers.ops import fmha

    return fmha.attn_bias.LowerTriangularMask()


def math_fn(mask: MaskKind) -> AttnFn:
    """The textbook computation, done entirely in the inputs' dtype (float64 for the reference)."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: Any) -> torch.Tensor:
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        scores = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        allowed: torch.Tensor | None = None
        if mask == "causal":
            allowed = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
        elif mask == "blockdiag":
            allowed = m[:, None] == m[None, :]
        elif mask == "padding":
            allowed = m[:, None, None, :]
        elif mask != "none":
            scores = scores + m
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        return (scores.softmax(dim=-1) @ vh).transpose(1, 2)

    return fn


def attention_fn(kernel: Kernel, mask: MaskKind) -> AttnFn:
    if kernel == "xformers":
        return _xformers(mask)
    if kernel == "sdpa":
        return _sdpa(mask)
    return math_fn(mask)


def wants_bias_grad(case: Case) -> bool:
    """A dense ``[B,H,M,N]`` bias is learnt in training (relative position biases): its
    gradient is checked too."""
    return case.mask == "bias"


def run_attention(
    fn: AttnFn,
    kernel: Kernel,
    inp: Inputs,
    grad_out: torch.Tensor | None,
    *,
    bias_grad: bool = False,
    prepare: Callable[[Inputs], Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Forward under ``no_grad`` (``grad_out`` None) or forward and backward; returns
    ``out`` (and ``dq``, ``dk``, ``dv``, with ``bias_grad`` ``dbias``) detached.
    ``prepare`` makes ``fn``'s mask argument (default: `mask_input` of ``kernel``)."""
    m = prepare(inp) if prepare is not None else mask_input(kernel, inp)
    if grad_out is None:
        with torch.no_grad():
            return {"out": fn(inp.q, inp.k, inp.v, m).detach()}
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    if bias_grad:
        m = _aligned(m.detach()).requires_grad_(True)
    out = fn(q, k, v, m)
    out.backward(grad_out.to(out.dtype))
    result = {"out": out.detach()}
    for name, t in (("dq", q), ("dk", k), ("dv", v)) + ((("dbias", m),) if bias_grad else ()):
        assert t.grad is not None, f"no gradient reached {name}"
        result[name] = t.grad.detach()
    return result


def max_abs_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max().item())


def nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum().item())
