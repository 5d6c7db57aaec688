"""What the suite measures, as plain data: the attention problems, the mask kinds and
forms, the seeds and the model's config. Standard library only, so that what reads the
suite's cases without running them (``envbuilder repro``, which writes a standalone
script of a recorded case) imports them from here instead of restating them.

The checks build their tensors from this plan (`checks_attention`, `checks_masks`,
`checks_compile`, `checks_model`); a case here is the case a result records (its
``label`` is the ``case``/``shapes`` number). Each function takes the device's kind
(``cuda``) and, where it matters, ``quick``, as the check's `Context` says them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

__all__ = [
    "ALIGNED_TEXT",
    "ATTENTION_GAIN",
    "ATTENTION_MASKS",
    "ATTENTION_SEEDS",
    "B1MN_SEEDS",
    "COMPILE_SEEDS",
    "DETERMINISM_SEEDS",
    "DTYPE_NAMES",
    "FORMS",
    "IMAGE_SIDE",
    "LARGE_LOGITS_SEEDS",
    "LEARNING_RATE",
    "MASKS",
    "MASKS_PATTERN_KEEP",
    "MASKS_PATTERN_SEED",
    "MASKS_SEED",
    "MODEL_INIT_SEED",
    "MODEL_INPUTS_SEED",
    "MODEL_LOSS_SEED",
    "UNALIGNED_TEXT",
    "Case",
    "Form",
    "MaskKind",
    "Seeds",
    "attention_cases",
    "compile_cases",
    "masks_case",
    "model_config",
]

#: ``bias``: a dense ``[B,H,M,N]`` tensor bias; ``padding``: an additive key-padding bias
#: built from a boolean ``[B,N]`` mask the way diffusers and transformers build it;
#: ``bias_b1mn``: a ``[B,1,M,N]`` bias passed as it is; ``bias_expanded``: the same,
#: ``expand``-ed to ``[B,H,M,N]``; ``blockdiag``: packed sequences (batch 1).
MaskKind = Literal["none", "causal", "blockdiag", "bias", "padding", "bias_b1mn", "bias_expanded"]
MASKS: tuple[MaskKind, ...] = (
    "none",
    "causal",
    "blockdiag",
    "bias",
    "padding",
    "bias_b1mn",
    "bias_expanded",
)
#: the mask kinds the attention group checks for correctness; ``[B,1,M,N]`` as it is has
#: its own check there.
ATTENTION_MASKS: tuple[MaskKind, ...] = (
    "none",
    "causal",
    "blockdiag",
    "bias",
    "padding",
    "bias_expanded",
)

#: the suite's dtype names -> torch's names of them
DTYPE_NAMES: dict[str, str] = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


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
            # three packed sequences whose lengths follow the length: a new packing per shape
            lengths = (self.M // 3, self.M // 2, self.M - self.M // 3 - self.M // 2)
            total = sum(lengths)
            return replace(self, B=1, M=total, N=total, mask=mask, seqlens=lengths)
        if mask == "causal":
            return replace(self, N=self.M, mask=mask)
        return replace(self, mask=mask)

    def padded(self, batch: int) -> int:
        """Keys of batch item ``batch`` that a ``padding`` mask hides (a third to a half)."""
        return self.N // 3 + (batch % 2) * (self.N // 6)


@dataclass(frozen=True)
class Seeds:
    """The seeds of one problem's q, k, v (``inputs``) and of its output gradient (``grad``);
    the i-th of a list of cases takes `at` (i)."""

    inputs: int
    grad: int

    def at(self, i: int) -> Seeds:
        return Seeds(self.inputs + i, self.grad + i)


# -- attention ------------------------------------------------------------------------------

#: the correctness checks' cases (the i-th case: ``.at(i)``), the ``[B,1,M,N]`` bias, the
#: determinism and the large-logits checks
ATTENTION_SEEDS = Seeds(100, 200)
B1MN_SEEDS = Seeds(7, 8)
DETERMINISM_SEEDS = Seeds(11, 12)
LARGE_LOGITS_SEEDS = Seeds(21, 22)


def attention_cases(*, cuda: bool, quick: bool) -> list[Case]:
    """Odd sequence lengths, head dims 32-256, batch > 1; small on CPU and in --quick runs."""
    if not cuda:
        return [Case(B=2, M=37, N=53, H=2, K=32), Case(B=2, M=17, N=17, H=2, K=64)]
    if quick:
        return [Case(B=2, M=97, N=129, H=4, K=64), Case(B=2, M=257, N=255, H=2, K=128)]
    return [
        Case(B=2, M=37, N=53, H=4, K=32),
        Case(B=3, M=97, N=129, H=4, K=64),
        Case(B=2, M=257, N=255, H=2, K=128),
        Case(B=2, M=129, N=67, H=2, K=256),
    ]


# -- masks through diffusers ----------------------------------------------------------------

Form: TypeAlias = Literal["bool2d", "bool4d_b11n", "bool4d_b1mn", "additive"]
FORMS: tuple[Form, ...] = ("bool2d", "bool4d_b11n", "bool4d_b1mn", "additive")

#: the seeds of q, k, v and of the mask pattern, additive bias and output gradient (recorded
#: in each check's numbers as ``seed`` and ``mask_seed``); the share of a ``[B,1,M,N]``
#: boolean pattern's entries kept
MASKS_SEED = 61
MASKS_PATTERN_SEED = 62
MASKS_PATTERN_KEEP = 0.7


def masks_case(*, cuda: bool) -> Case:
    # N a multiple of 8: xformers needs a tensor bias whose rows are 8-aligned in storage,
    # and a 4-D mask reaches it as it is (expanded): the check is about the mask's meaning
    if cuda:
        return Case(B=2, M=128, N=128, H=4, K=64)
    return Case(B=2, M=32, N=32, H=2, K=16)


# -- torch.compile --------------------------------------------------------------------------

#: every compiled problem's seeds (the i-th shape of a dynamic run: ``.at(i)``)
COMPILE_SEEDS = Seeds(300, 400)


def compile_cases(*, cuda: bool) -> list[Case]:
    """The two shapes a compiled function runs (static: the first; dynamic: both).

    No two sizes of the first shape are equal (dynamo would tie them with a guard), and
    the sequence lengths agree modulo 64: kernels choose by alignment, and dynamo may
    specialise on it (on an H200, SDPA with a mask compiled a second version for 77
    and 128). One version must serve every length of one alignment class."""
    if cuda:
        return [Case(B=2, M=77, N=77, H=4, K=64), Case(B=3, M=141, N=141, H=4, K=64)]
    return [Case(B=2, M=24, N=24, H=3, K=32), Case(B=4, M=40, N=40, H=3, K=32)]


# -- the diffusers model --------------------------------------------------------------------


def model_config(*, cuda: bool) -> dict[str, Any]:
    """``QwenImageTransformer2DModel``'s keyword arguments: a tiny random model."""
    if cuda:
        return {
            "patch_size": 2,
            "in_channels": 16,
            "out_channels": 4,
            "num_layers": 2,
            "attention_head_dim": 64,
            "num_attention_heads": 4,
            "joint_attention_dim": 64,
            "axes_dims_rope": (16, 24, 24),
        }
    return {
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 4,
        "num_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "axes_dims_rope": (4, 6, 6),
    }


#: the seeds of the model's random init, of its inputs and of the loss's weights
MODEL_INIT_SEED = 0
MODEL_INPUTS_SEED = 3
MODEL_LOSS_SEED = 5
#: how much the attention's output projections are scaled up at init (see
#: ``checks_model._model``)
ATTENTION_GAIN = 8.0
#: text tokens for the gate checks (joint length 128) and for the unaligned case (125)
ALIGNED_TEXT = 64
UNALIGNED_TEXT = 61
#: the latent is IMAGE_SIDE x IMAGE_SIDE patches (image tokens)
IMAGE_SIDE = 8
#: SGD's learning rate: large enough that the update, not the rounding of the
#: stored weights, decides the updated parameters.
LEARNING_RATE = 0.5
