"""A real diffusers model: the Qwen-Image double-stream transformer at a tiny random config.

No weights are downloaded. Its default attention (PyTorch's SDPA, diffusers'
"native" backend) and diffusers' xformers path (``set_attention_backend(
"xformers")`` in current releases, ``enable_xformers_memory_efficient_attention()``
in older ones) run eagerly and compiled; each output is compared with the same
model in float64 using the tolerance rule, with the default backend run
eagerly in the same dtype as the "math path". The text stream carries a
padding mask, the case where diffusers hands xformers a tensor bias.

The gate checks use 256 image and 16 text tokens, so the joint sequence (272)
is a multiple of 8: xformers' kernels need a tensor bias whose rows start on
8-element boundaries, and a caller has to pad for that. Whether diffusers does
is recorded apart, by an info check at 13 text tokens (joint length 269): in a
real pipeline the prompt decides the text length, so an unaligned length is
the common case, and a rejection there is a finding about this diffusers and
xformers, not a reason to call the combination broken.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch

from envbuilder.conformance import tolerance
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Impl, Number, Outcome, Skip, describe_error

__all__ = ["specs"]


def _config(ctx: Context) -> dict[str, Any]:
    if ctx.is_cuda:
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


def _model(ctx: Context) -> Any:
    try:
        from diffusers import QwenImageTransformer2DModel
    except ImportError as e:
        raise Skip(f"this diffusers has no QwenImageTransformer2DModel: {e}") from e
    torch.manual_seed(0)
    return QwenImageTransformer2DModel(**_config(ctx)).eval()


#: text tokens for the gate checks (joint length 272 on CUDA) and for the unaligned case (269).
ALIGNED_TEXT = 16
UNALIGNED_TEXT = 13


def _inputs(ctx: Context, dtype: torch.dtype, text: int) -> dict[str, Any]:
    cfg = _config(ctx)
    batch, h, w = 2, (16 if ctx.is_cuda else 8), (16 if ctx.is_cuda else 8)
    gen = torch.Generator(device="cpu").manual_seed(3)
    mask = torch.ones(batch, text, dtype=torch.bool)
    mask[1, -4:] = False  # the second prompt is shorter: padding the attention must ignore
    return {
        "hidden_states": torch.randn(batch, h * w, cfg["in_channels"], generator=gen).to(
            ctx.device, dtype
        ),
        "encoder_hidden_states": torch.randn(
            batch, text, cfg["joint_attention_dim"], generator=gen
        ).to(ctx.device, dtype),
        "encoder_hidden_states_mask": mask.to(ctx.device),
        "timestep": torch.tensor([0.3, 0.7], device=ctx.device, dtype=dtype),
        "img_shapes": [(1, h, w)] * batch,
        "return_dict": False,
    }


def _set_backend(model: Any, backend: str) -> None:
    if hasattr(model, "set_attention_backend"):
        model.set_attention_backend(backend)
    elif backend == "xformers":
        model.enable_xformers_memory_efficient_attention()
    else:
        model.disable_xformers_memory_efficient_attention()


def _run(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(**inputs)[0]
    return out.detach()


def _diffusers_version() -> str:
    import diffusers

    return str(getattr(diffusers, "__version__", "unknown"))


def model_check(ctx: Context, impl: Impl, compiled: bool, *, text: int = ALIGNED_TEXT) -> Outcome:
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")
    base = _model(ctx)
    reference = copy.deepcopy(base).to(ctx.device, torch.float64)
    _set_backend(reference, "native")
    expected = _run(reference, _inputs(ctx, torch.float64, text))
    model = base.to(ctx.device, dtype)
    _set_backend(model, "native")
    inputs = _inputs(ctx, dtype, text)
    default_eager = _run(model, inputs)
    if impl == "xformers":
        _set_backend(model, "xformers")
    numbers: dict[str, Number] = {
        "model": type(base).__name__,
        "diffusers": _diffusers_version(),
        "config": str(_config(ctx)),
        "dtype": dtype_name,
        "backend": "xformers" if impl == "xformers" else "native",
        "compiled": compiled,
        "joint_tokens": inputs["hidden_states"].shape[1] + text,
        "rule": tolerance.RULE,
    }
    runner: Any = model
    if compiled:
        torch._dynamo.reset()
        runner = torch.compile(model)
    try:
        got = _run(runner, inputs)
    except Exception as e:  # the backend or the compiler refusing the model is the finding
        return Outcome.failed(describe_error(e), numbers)
    bad = int((~torch.isfinite(got)).sum().item())
    verdict = tolerance.judge(
        float((got.double() - expected).abs().max().item()),
        float((default_eager.double() - expected).abs().max().item()),
        dtype_name,
    )
    numbers |= {
        "error": verdict.error,
        "default_eager_error": verdict.math_error,
        "bound": verdict.bound,
        "nonfinite": bad,
    }
    problems = []
    if bad:
        problems.append(f"{bad} NaN/inf values in the output")
    elif not verdict.ok:
        problems.append(
            f"output error {verdict.error:.3g} vs float64 > bound {verdict.bound:.3g}"
            f" (default attention, eager: {verdict.math_error:.3g})"
        )
    return Outcome.judge(problems, numbers)


def unaligned_mask(ctx: Context) -> Outcome:
    """diffusers' xformers path at a joint length that is not a multiple of 8 (info).

    Passes when the output is right; fails naming what happened when xformers
    rejects the bias diffusers built (and what a caller can do) or when the
    output is wrong.
    """
    outcome = model_check(ctx, "xformers", False, text=UNALIGNED_TEXT)
    numbers = dict(outcome.numbers)
    if outcome.status == "pass":
        return Outcome.passed(numbers | {"outcome": "handled"})
    if "error" in numbers:  # it ran: the numbers are wrong
        return Outcome.failed(outcome.reason, numbers | {"outcome": "silently-wrong"})
    if "NotImplementedError" not in outcome.reason:  # not xformers turning the inputs down
        return Outcome.failed(outcome.reason, numbers | {"outcome": "error"})
    return Outcome.failed(
        f"with a padding mask and {numbers['joint_tokens']} joint tokens (not a multiple of 8)"
        " diffusers hands xformers a tensor bias it rejects; pad the prompt so that image plus"
        " text tokens are a multiple of 8, or use the default attention backend: " + outcome.reason,
        numbers | {"outcome": "rejected"},
    )


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    for impl, compiled in (("xformers", False), ("xformers", True), ("sdpa", True)):
        needs = {"diffusers"} | ({"cuda"} if impl == "xformers" else set())
        out.append(
            CheckSpec(
                name=f"model.diffusers.qwenimage.{impl}.{'compiled' if compiled else 'eager'}",
                gate=True,
                impl="xformers" if impl == "xformers" else "sdpa",
                needs=frozenset(needs),
                run=partial(
                    model_check, ctx, "xformers" if impl == "xformers" else "sdpa", compiled
                ),
                quick=False,  # a real model costs ~35 s on an H200: full runs only
            )
        )
    out.append(
        CheckSpec(
            name="model.diffusers.qwenimage.xformers.unaligned_mask",
            gate=False,
            impl="xformers",
            needs=frozenset({"diffusers", "cuda"}),
            run=partial(unaligned_mask, ctx),
            quick=False,
        )
    )
    return out
