"""What a failing conformance check ran, rebuilt from its name and its results.

A check's name says its case (``compile.xformers.bias.static.fullgraph.fp16.backward``);
the suite's definitions (`envbuilder.conformance`) say the rest: the shapes for the
device it ran on, the seeds, the model's configuration. Those definitions import torch,
which ``envbuilder repro`` must not need, so they are restated here as plain data;
``tests/unit/test_repro.py`` checks every value against the suite itself, so the two
cannot drift apart unnoticed.

`plan` turns one recorded check into one of the case records below; it raises
`UnsupportedCheck` for checks no script can rebuild (environment facts, timings,
multi-GPU runs) and for names of another suite version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from envbuilder.errors import InputError

__all__ = [
    "AttentionCase",
    "CompileCase",
    "DropoutCase",
    "MaskFormCase",
    "ModelCase",
    "Profile",
    "ReproCase",
    "Shape",
    "UnsupportedCheck",
    "plan",
]

Impl: TypeAlias = Literal["xformers", "sdpa"]
#: ``dynamo-disable``: the attention behind ``torch.compiler.disable`` inside compiled code
#: (``envbuilder.conformance._workaround``); None: the check's own case
Disable: TypeAlias = Literal["dynamo-disable"] | None
Mask: TypeAlias = Literal[
    "none", "causal", "blockdiag", "bias", "padding", "bias_b1mn", "bias_expanded"
]
MASKS: tuple[Mask, ...] = (
    "none",
    "causal",
    "blockdiag",
    "bias",
    "padding",
    "bias_b1mn",
    "bias_expanded",
)
DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")
#: the mask forms of the ``masks`` group: what a user hands diffusers' attention dispatch.
MaskForm: TypeAlias = Literal["bool2d", "bool4d_b11n", "bool4d_b1mn", "additive"]
MASK_FORMS: tuple[MaskForm, ...] = ("bool2d", "bool4d_b11n", "bool4d_b1mn", "additive")

#: the families ``envbuilder repro`` rebuilds, for messages
SUPPORTED = (
    "attention.<impl>.<mask>.<dtype>.<forward|backward>",
    "attention.<impl>.bias_b1mn.safe",
    "attention.<impl>.dropout",
    "compile.<impl>.<mask>.<static|dynamic>.<fullgraph|nobreaks>.<dtype>.<forward|backward>",
    "compile.<impl>.dropout",
    "model.diffusers.qwenimage.<impl>.<inference|training>.<eager|compiled>",
    "model.diffusers.qwenimage.xformers.unaligned_mask",
    "masks.<native|xformers>.<form>.<dtype>",
    "and their .sdpa_instead / .sdpa_under_compile / .dynamo_disable workaround checks",
)


class UnsupportedCheck(InputError):
    """No script rebuilds this check (its kind, or its suite version's naming)."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Where the suite ran: the device decides the shapes, ``quick`` the attention cases."""

    cuda: bool
    quick: bool


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One attention problem (``envbuilder.conformance._attn.Case`` after ``with_mask``)."""

    B: int
    M: int
    N: int
    H: int
    K: int
    mask: Mask = "none"
    seqlens: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        extra = f" seqlens={list(self.seqlens)}" if self.seqlens else ""
        return f"B{self.B} M{self.M} N{self.N} H{self.H} K{self.K} {self.mask}{extra}"

    def with_mask(self, mask: Mask) -> Shape:
        if mask == "blockdiag":
            lengths = (self.M // 3, self.M // 2, self.M - self.M // 3 - self.M // 2)
            total = sum(lengths)
            return replace(self, B=1, M=total, N=total, mask=mask, seqlens=lengths)
        if mask == "causal":
            return replace(self, N=self.M, mask=mask)
        return replace(self, mask=mask)


def _base_cases(profile: Profile) -> tuple[Shape, ...]:
    """``checks_attention.base_cases``."""
    if not profile.cuda:
        return (Shape(B=2, M=37, N=53, H=2, K=32), Shape(B=2, M=17, N=17, H=2, K=64))
    if profile.quick:
        return (Shape(B=2, M=97, N=129, H=4, K=64), Shape(B=2, M=257, N=255, H=2, K=128))
    return (
        Shape(B=2, M=37, N=53, H=4, K=32),
        Shape(B=3, M=97, N=129, H=4, K=64),
        Shape(B=2, M=257, N=255, H=2, K=128),
        Shape(B=2, M=129, N=67, H=2, K=256),
    )


def _compile_shapes(profile: Profile, mask: Mask, dynamic: bool) -> tuple[Shape, ...]:
    """``checks_compile.shapes``."""
    if profile.cuda:
        cases = (Shape(B=2, M=77, N=77, H=4, K=64), Shape(B=3, M=141, N=141, H=4, K=64))
    else:
        cases = (Shape(B=2, M=24, N=24, H=3, K=32), Shape(B=4, M=40, N=40, H=3, K=32))
    return tuple(c.with_mask(mask) for c in cases[: 2 if dynamic else 1])


def _dropout_shape(profile: Profile) -> tuple[Shape, str]:
    """``_dropout._case``."""
    if profile.cuda:
        return Shape(B=4, M=256, N=256, H=8, K=64), "bf16"
    return Shape(B=4, M=128, N=128, H=4, K=32), "fp32"


def _model_config(profile: Profile) -> dict[str, object]:
    """``checks_model._config``."""
    if profile.cuda:
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


#: ``checks_model``'s constants
MODEL_ALIGNED_TEXT = 64
MODEL_UNALIGNED_TEXT = 61
MODEL_IMAGE_SIDE = 8
MODEL_ATTENTION_GAIN = 8.0
MODEL_LEARNING_RATE = 0.5
#: ``_dropout``'s constants
DROPOUT_P = 0.3
DROPOUT_STD_DEVIATIONS = 6.0
#: ``checks_masks``' constants: the seeds (recorded as ``seed`` / ``mask_seed`` since they
#: were named; these before) and the share of a ``[B,1,M,N]`` boolean pattern kept
MASKS_SEED = 61
MASKS_MASK_SEED = 62
MASKS_PATTERN_KEEP = 0.7


def _masks_shape(profile: Profile) -> Shape:
    """``checks_masks._case``: the case when the results do not name one."""
    if profile.cuda:
        return Shape(B=2, M=128, N=128, H=4, K=64)
    return Shape(B=2, M=32, N=32, H=2, K=16)


@dataclass(frozen=True, kw_only=True)
class Seeded:
    """A shape with the seeds of its inputs and of the output gradient."""

    shape: Shape
    seed: int
    grad_seed: int


@dataclass(frozen=True, kw_only=True)
class AttentionCase:
    """``checks_attention.correctness`` (and ``b1mn_bias``: one case, a rejection passes)."""

    impl: Impl
    mask: Mask
    dtype: str
    backward: bool
    cases: tuple[Seeded, ...]
    rejection_passes: bool = False


@dataclass(frozen=True, kw_only=True)
class CompileCase:
    """``checks_compile.compile_check``."""

    impl: Impl
    mask: Mask
    dynamic: bool
    fullgraph: bool
    dtype: str
    backward: bool
    cases: tuple[Seeded, ...]
    #: ``dynamo-disable``: a compiled layer (projections around the call) calling ``impl``'s
    #: attention behind ``torch.compiler.disable``, compiled without ``fullgraph``
    workaround: Disable = None


@dataclass(frozen=True, kw_only=True)
class DropoutCase:
    """``_dropout.dropout_check``."""

    impl: Impl
    compiled: bool
    shape: Shape
    dtype: str
    #: ``dynamo-disable``: a compiled layer calling the dropout attention behind the disable
    workaround: Disable = None


@dataclass(frozen=True, kw_only=True)
class ModelCase:
    """``checks_model.model_check``: the Qwen-Image transformer through diffusers."""

    impl: Impl
    training: bool
    compiled: bool
    text: int
    config: Mapping[str, object]
    dtype: str  # fp16 on a GPU, fp32 on the CPU
    #: ``dynamo-disable``: the transformer module's ``dispatch_attention_fn`` behind the disable
    workaround: Disable = None


@dataclass(frozen=True, kw_only=True)
class MaskFormCase:
    """The ``masks`` group: diffusers' ``dispatch_attention_fn`` with one mask form."""

    backend: Literal["native", "xformers"]
    form: MaskForm
    dtype: str
    shape: Shape
    seed: int
    mask_seed: int
    shape_recorded: bool  # False: the results named no case and the suite's was used


ReproCase: TypeAlias = AttentionCase | CompileCase | DropoutCase | ModelCase | MaskFormCase

_LABEL = re.compile(r"B(\d+) M(\d+) N(\d+) H(\d+) K(\d+)")


def infer_profile(
    name: str, numbers: Mapping[str, object], *, cuda: bool, file_says_quick: bool
) -> Profile:
    """The run's profile: ``cuda`` from the runner's GPUs; ``quick`` from how many attention
    cases the check ran (``numbers["cases"]`` plus the unsupported ones), else from the
    file's name (``….quick.json``)."""
    cases = numbers.get("cases")
    if isinstance(cases, int) and not isinstance(cases, bool) and name.startswith("attention."):
        unsupported = numbers.get("unsupported")
        total = cases + (len(str(unsupported).split(" || ")) if unsupported else 0)
        if cuda and total in (2, 4):
            return Profile(cuda=True, quick=total == 2)
    return Profile(cuda=cuda, quick=file_says_quick)


def _unsupported(name: str, why: str) -> UnsupportedCheck:
    return UnsupportedCheck(
        f"no reproducer for {name!r}: {why}; envbuilder repro rebuilds: " + ", ".join(SUPPORTED)
    )


def plan(name: str, numbers: Mapping[str, object], profile: Profile) -> ReproCase:
    """The case check ``name`` ran under ``profile`` (``numbers``: what it recorded)."""
    parts = name.split(".")
    if parts[-1] == "dynamo_disable":
        return _disabled(plan(".".join(parts[:-1]), numbers, profile), name, numbers)
    if parts[-1] in ("sdpa_instead", "sdpa_under_compile"):
        direct = plan(".".join(parts[:-1]), numbers, profile)
        return _with_sdpa(direct, name)
    group = parts[0]
    if group == "attention":
        return _attention(name, parts, profile)
    if group == "compile":
        return _compile(name, parts, profile)
    if group == "model":
        return _model(name, parts, profile)
    if group == "masks":
        return _masks(name, parts, numbers, profile)
    raise _unsupported(name, f"the {group!r} group measures no case a script can rebuild")


def _with_sdpa(case: ReproCase, name: str) -> ReproCase:
    if isinstance(case, MaskFormCase):
        return replace(case, backend="native")
    return replace(case, impl="sdpa")


def _disabled(case: ReproCase, name: str, numbers: Mapping[str, object]) -> ReproCase:
    """The covered check's case with its attention behind ``torch.compiler.disable`` inside
    compiled code, running the kernel the check recorded (``disabled_kernel``; xformers)."""
    kernel = _impl(name, str(numbers.get("disabled_kernel") or "xformers"))
    if isinstance(case, CompileCase):
        return replace(case, impl=kernel, fullgraph=False, workaround="dynamo-disable")
    if isinstance(case, DropoutCase) and case.compiled:
        return replace(case, impl=kernel, workaround="dynamo-disable")
    if isinstance(case, ModelCase) and case.compiled:
        return replace(case, impl=kernel, workaround="dynamo-disable")
    raise _unsupported(name, "the suite has no dynamo-disable workaround for this check")


def _impl(name: str, value: str) -> Impl:
    if value == "xformers":
        return "xformers"
    if value == "sdpa":
        return "sdpa"
    raise _unsupported(name, f"unknown implementation {value!r}")


def _mask(name: str, value: str) -> Mask:
    for mask in MASKS:
        if mask == value:
            return mask
    raise _unsupported(name, f"unknown mask kind {value!r}")


def _dtype(name: str, value: str) -> str:
    if value not in DTYPES:
        raise _unsupported(name, f"unknown dtype {value!r} (known: {', '.join(DTYPES)})")
    return value


def _direction(name: str, value: str) -> bool:
    if value not in ("forward", "backward"):
        raise _unsupported(name, f"expected forward or backward, not {value!r}")
    return value == "backward"


def _attention(name: str, parts: list[str], profile: Profile) -> AttentionCase | DropoutCase:
    if len(parts) == 3 and parts[2] == "dropout":
        shape, dtype = _dropout_shape(profile)
        return DropoutCase(impl=_impl(name, parts[1]), compiled=False, shape=shape, dtype=dtype)
    if len(parts) == 4 and parts[2:] == ["bias_b1mn", "safe"]:
        shape = _base_cases(profile)[0].with_mask("bias_b1mn")
        return AttentionCase(
            impl=_impl(name, parts[1]),
            mask="bias_b1mn",
            dtype="bf16" if profile.cuda else "fp32",
            backward=True,
            cases=(Seeded(shape=shape, seed=7, grad_seed=8),),
            rejection_passes=True,
        )
    if len(parts) != 5:
        raise _unsupported(name, "not an attention correctness, dropout or [B,1,M,N] check")
    impl, mask = _impl(name, parts[1]), _mask(name, parts[2])
    cases = tuple(
        Seeded(shape=base.with_mask(mask), seed=100 + i, grad_seed=200 + i)
        for i, base in enumerate(_base_cases(profile))
    )
    return AttentionCase(
        impl=impl,
        mask=mask,
        dtype=_dtype(name, parts[3]),
        backward=_direction(name, parts[4]),
        cases=cases,
    )


def _compile(name: str, parts: list[str], profile: Profile) -> CompileCase | DropoutCase:
    if len(parts) == 3 and parts[2] == "dropout":
        shape, dtype = _dropout_shape(profile)
        return DropoutCase(impl=_impl(name, parts[1]), compiled=True, shape=shape, dtype=dtype)
    if len(parts) != 7:
        raise _unsupported(name, "not a compiled attention or dropout check")
    impl, mask = _impl(name, parts[1]), _mask(name, parts[2])
    if parts[3] not in ("static", "dynamic") or parts[4] not in ("fullgraph", "nobreaks"):
        raise _unsupported(name, "expected <static|dynamic>.<fullgraph|nobreaks>")
    dynamic = parts[3] == "dynamic"
    cases = tuple(
        Seeded(shape=shape, seed=300 + i, grad_seed=400 + i)
        for i, shape in enumerate(_compile_shapes(profile, mask, dynamic))
    )
    return CompileCase(
        impl=impl,
        mask=mask,
        dynamic=dynamic,
        fullgraph=parts[4] == "fullgraph",
        dtype=_dtype(name, parts[5]),
        backward=_direction(name, parts[6]),
        cases=cases,
    )


def _model(name: str, parts: list[str], profile: Profile) -> ModelCase:
    if parts[1:3] != ["diffusers", "qwenimage"] or len(parts) not in (5, 6):
        raise _unsupported(name, "not a Qwen-Image transformer check")
    impl = _impl(name, parts[3])
    dtype = "fp16" if profile.cuda else "fp32"
    config = _model_config(profile)
    if parts[4:] == ["unaligned_mask"]:
        return ModelCase(
            impl=impl,
            training=False,
            compiled=False,
            text=MODEL_UNALIGNED_TEXT,
            config=config,
            dtype=dtype,
        )
    if (
        len(parts) != 6
        or parts[4] not in ("inference", "training")
        or parts[5] not in ("eager", "compiled")
    ):
        raise _unsupported(name, "expected <impl>.<inference|training>.<eager|compiled>")
    return ModelCase(
        impl=impl,
        training=parts[4] == "training",
        compiled=parts[5] == "compiled",
        text=MODEL_ALIGNED_TEXT,
        config=config,
        dtype=dtype,
    )


def _masks(
    name: str, parts: list[str], numbers: Mapping[str, object], profile: Profile
) -> MaskFormCase:
    if len(parts) != 4:
        raise _unsupported(name, "expected masks.<native|xformers>.<form>.<dtype>")
    backend: Literal["native", "xformers"]
    if parts[1] == "native":
        backend = "native"
    elif parts[1] == "xformers":
        backend = "xformers"
    else:
        raise _unsupported(name, f"unknown attention backend {parts[1]!r} (native, xformers)")
    form = next((f for f in MASK_FORMS if f == parts[2]), None)
    if form is None:
        raise _unsupported(name, f"unknown mask form {parts[2]!r} ({', '.join(MASK_FORMS)})")
    shape, recorded = _masks_shape(profile), False
    found = _LABEL.search(str(numbers.get("case", "")))
    if found:
        b, m, n, h, k = (int(g) for g in found.groups())
        shape, recorded = Shape(B=b, M=m, N=n, H=h, K=k), True
    return MaskFormCase(
        backend=backend,
        form=form,
        dtype=_dtype(name, parts[3]),
        shape=shape,
        seed=_int(numbers.get("seed"), MASKS_SEED),
        mask_seed=_int(numbers.get("mask_seed"), MASKS_MASK_SEED),
        shape_recorded=recorded,
    )


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
