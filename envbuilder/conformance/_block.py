"""A pre-norm transformer block on xformers' or SDPA's causal attention, for the
timing and multi-GPU checks (the compile group compiles attention functions
directly, `envbuilder.conformance.checks_compile`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["AttnFn", "Block", "SelfAttention", "attn_sdpa", "attn_xformers"]

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
