"""A real diffusers model: the Qwen-Image double-stream transformer at a tiny random config.

No weights are downloaded. Its default attention (PyTorch's SDPA, diffusers'
"native" backend) and diffusers' xformers path (``set_attention_backend(
"xformers")`` in current releases, ``enable_xformers_memory_efficient_attention()``
in older ones) run eagerly and compiled, for inference (``eval()``, forward
under ``no_grad``) and for one training step (forward, a loss, backward, an SGD
step). Output, gradients and updated parameters are compared with the same
step in float64 (from the same rounded weights) under the tolerance rule; the
"math path" is the model with diffusers' ``_native_math`` backend (the
textbook attention) run eagerly in the same dtype. The text stream carries a
padding mask, the case where diffusers hands xformers a tensor bias; the
nearest plausible wrong answer is the model run without that mask, and the
padding is long enough for it to lie at least 4 bounds away (sensitivity
rule, `envbuilder.conformance.tolerance`). A failing xformers check is re-run
on the same case with the default backend in xformers' place and, compiled,
with the workaround that keeps xformers as users apply it: the transformer
module's ``dispatch_attention_fn`` replaced by itself behind
``torch.compiler.disable``, so that the compiled transformer breaks its graph
at every attention call and runs xformers eagerly. Each workaround check
records the evidence that it was applied (`envbuilder.conformance._workaround`).

The gate checks use 256 image and 16 text tokens, so the joint sequence (272)
is a multiple of 8: xformers' kernels need a tensor bias whose rows start on
8-element boundaries, and a caller has to pad for that. Whether diffusers does
is recorded apart, by an info check at 13 text tokens (joint length 269): in a
real pipeline the prompt decides the text length, so an unaligned length is
the common case, and a rejection there is a finding about this diffusers and
xformers, not a reason to call the combination broken.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from envbuilder.conformance import _fault, tolerance
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import (
    CheckSpec,
    Impl,
    Number,
    Outcome,
    Skip,
    Use,
    Workaround,
    describe_error,
)
from envbuilder.conformance._workaround import (
    Disabled,
    watching,
    with_evidence,
)

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
    model: Any = QwenImageTransformer2DModel(**_config(ctx))
    model.eval()
    # At this random init the MLPs decide the output and attention barely moves it:
    # the model without its mask would lie within the bound. Scaled up, the
    # attention's output projections make the mask visible (the sensitivity rule).
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("attn.to_out.0", "attn.to_add_out")):
                module.weight.mul_(ATTENTION_GAIN)
    return model


#: how much the attention's output projections are scaled up at init (see ``_model``)
ATTENTION_GAIN = 8.0


#: text tokens for the gate checks (joint length 128) and for the unaligned case (125).
ALIGNED_TEXT = 64
UNALIGNED_TEXT = 61
#: the latent is IMAGE_SIDE x IMAGE_SIDE patches (image tokens)
IMAGE_SIDE = 8


def _inputs(ctx: Context, dtype: torch.dtype, text: int) -> dict[str, Any]:
    cfg = _config(ctx)
    batch, h, w = 2, IMAGE_SIDE, IMAGE_SIDE
    gen = torch.Generator(device="cpu").manual_seed(3)
    mask = torch.ones(batch, text, dtype=torch.bool)
    # shorter prompts: padding the attention must ignore, long enough that the model
    # run without its mask lies well outside the bound (the sensitivity rule)
    mask[0, text // 4 :] = False
    mask[1, 4:] = False
    prompts = torch.randn(batch, text, cfg["joint_attention_dim"], generator=gen)
    # padded positions all hold one pad token's embedding, as a tokenizer's padding does
    prompts[~mask] = torch.randn(cfg["joint_attention_dim"], generator=gen)
    return {
        "hidden_states": torch.randn(batch, h * w, cfg["in_channels"], generator=gen).to(
            ctx.device, dtype
        ),
        "encoder_hidden_states": prompts.to(ctx.device, dtype),
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
    elif backend == "_native_math":
        raise Skip("this diffusers has no attention backends (set_attention_backend)")
    else:
        model.disable_xformers_memory_efficient_attention()


def _diffusers_version() -> str:
    import diffusers

    return str(getattr(diffusers, "__version__", "unknown"))


#: SGD's learning rate: large enough that the update, not the rounding of the
#: stored weights, decides the updated parameters.
LEARNING_RATE = 0.5


def _loss_weights(out_shape: torch.Size, device: str) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(5)
    return torch.randn(*out_shape, generator=gen, dtype=torch.float64).to(device)


def _step(
    model: Any, runner: Any, inputs: dict[str, Any], training: bool
) -> dict[str, torch.Tensor]:
    """An inference forward, or one training step; what the check compares, in float64."""
    if not training:
        model.eval()
        with torch.no_grad():
            out: torch.Tensor = runner(**inputs)[0]
        return {"output": out.detach().double()}
    model.train()
    model.zero_grad(set_to_none=True)
    out = runner(**inputs)[0]
    (out.double() * _loss_weights(out.shape, str(out.device))).sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.cat([p.grad.double().flatten() for p in params if p.grad is not None])
    torch.optim.SGD(params, lr=LEARNING_RATE).step()
    updated = torch.cat([p.detach().double().flatten() for p in params])
    return {"output": out.detach().double(), "gradients": grads, "updated parameters": updated}


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().item())


#: the module whose attention processor calls ``dispatch_attention_fn``: what a user
#: patches to keep diffusers' attention call out of the compiled graph
_TRANSFORMER_MODULE = "diffusers.models.transformers.transformer_qwenimage"


@contextlib.contextmanager
def _dispatch_disabled(disabled: Disabled) -> Iterator[None]:
    """The transformer's ``dispatch_attention_fn`` behind ``torch.compiler.disable`` (and
    counting), as a user patches it, for the block only."""
    module = importlib.import_module(_TRANSFORMER_MODULE)
    original = getattr(module, "dispatch_attention_fn", None)
    if original is None:
        raise Skip(f"{_TRANSFORMER_MODULE} has no dispatch_attention_fn to wrap")
    setattr(module, "dispatch_attention_fn", disabled.wrap(original))  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "dispatch_attention_fn", original)  # noqa: B010


def model_check(
    ctx: Context,
    impl: Impl,
    compiled: bool,
    training: bool,
    *,
    text: int = ALIGNED_TEXT,
    workaround: Workaround | None = None,
) -> Outcome:
    """One model case; with ``workaround``, that workaround's check (``dynamo-disable``
    disables ``impl``'s attention dispatch inside the compiled transformer)."""
    # fp16 on a GPU: in bf16 the model's own rounding (3 x the math path's error) hides
    # the mask (the model without it lay at 2 bounds); fp16's 3 more bits leave it at 8
    dtype = torch.float16 if ctx.is_cuda else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")
    low = _model(ctx).to(ctx.device, dtype)
    inputs = _inputs(ctx, dtype, text)
    inputs64 = _inputs(ctx, torch.float64, text)

    def variant(backend: str, dtype: torch.dtype) -> Any:
        model = copy.deepcopy(low).to(dtype)
        _set_backend(model, backend)
        return model

    reference = variant("native", torch.float64)
    expected = _step(reference, reference, inputs64, training)
    unmasked = variant("native", torch.float64)
    wrong = _step(unmasked, unmasked, inputs64 | {"encoder_hidden_states_mask": None}, training)
    textbook = variant("_native_math", dtype)
    math_path = _step(textbook, textbook, inputs, training)
    model = variant("xformers" if impl == "xformers" else "native", dtype)
    numbers: dict[str, Number] = {
        "model": type(low).__name__,
        "diffusers": _diffusers_version(),
        "config": str(_config(ctx)),
        "dtype": dtype_name,
        "backend": "xformers" if impl == "xformers" else "native",
        "compiled": compiled,
        "training": training,
        "joint_tokens": inputs["hidden_states"].shape[1] + text,
        "padded_text_tokens": int((~inputs["encoder_hidden_states_mask"]).sum()),
    }
    from torch._dynamo.utils import counters

    runner: Any = model
    if compiled:
        torch._dynamo.reset()  # clears dynamo's counters too
        runner = torch.compile(model)
    disabled: Disabled | None = None
    patched: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if workaround == "dynamo-disable":
        disabled = Disabled(kernel="xformers" if impl == "xformers" else "sdpa")
        patched = _dispatch_disabled(disabled)
    breaks_before = sum(counters["graph_break"].values())
    times: list[float] = []
    xformers_calls = [0]
    try:
        with patched:
            for step in range(3 if compiled else 2):  # compiled: the first step compiles
                stepped = copy.deepcopy(model) if training else model
                t0 = time.perf_counter()
                # the first step (untimed for step_ms) gathers the workaround's evidence
                with watching(disabled, workaround, xformers_calls, first=step == 0):
                    got = _step(model, runner, inputs, training)
                if ctx.is_cuda:
                    torch.cuda.synchronize(ctx.device)
                times.append(time.perf_counter() - t0)
                if training:  # every step starts from the same weights
                    model.load_state_dict(stepped.state_dict())
    except Skip:
        raise
    except Exception as e:  # the backend or the compiler refusing the model is the finding
        breaks = int(sum(counters["graph_break"].values()) - breaks_before)
        failed = Outcome.failed(describe_error(e), numbers | _fault.error_fault(e))
        return with_evidence(failed, workaround, disabled, breaks, xformers_calls[0])
    numbers["step_ms"] = round(statistics.median(times[1:]) * 1000, 3)
    breaks = int(sum(counters["graph_break"].values()) - breaks_before)
    numbers["graph_breaks"] = breaks
    problems: list[str] = []
    comparisons: list[tolerance.Comparison] = []
    for name, value in got.items():
        bad = int((~torch.isfinite(value)).sum().item())
        numbers[f"{name.replace(' ', '_')}_nonfinite"] = bad
        if bad:
            problems.append(f"{bad} NaN/inf values in the {name}")
            continue
        comparisons.append(
            tolerance.compare(
                name,
                _max_abs(value, expected[name]),
                _max_abs(math_path[name], expected[name]),
                dtype_name,
                _max_abs(wrong[name], expected[name]),
            )
        )
    outcome = tolerance.assess(
        comparisons, wrong="the model without its padding mask", problems=problems, numbers=numbers
    )
    if outcome.status == "fail":
        subject = f"diffusers {numbers['backend']} backend, {'compiled ' if compiled else ''}model"
        outcome = Outcome.failed(
            outcome.reason, dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject)
        )
    return with_evidence(outcome, workaround, disabled, breaks, xformers_calls[0])


def unaligned_mask(ctx: Context) -> Outcome:
    """diffusers' xformers path at a joint length that is not a multiple of 8 (info).

    Passes when the output is right; fails naming what happened when xformers
    rejects the bias diffusers built (and what a caller can do) or when the
    output is wrong.
    """
    outcome = model_check(ctx, "xformers", False, False, text=UNALIGNED_TEXT)
    numbers = dict(outcome.numbers)
    if outcome.status == "pass":
        return Outcome.passed(numbers | {"outcome": "handled"})
    if "error" in numbers:  # it ran: the numbers are wrong (or could not be told apart)
        return Outcome.failed(outcome.reason, numbers | {"outcome": "silently-wrong"})
    if "NotImplementedError" not in outcome.reason:  # not xformers turning the inputs down
        return Outcome.failed(outcome.reason, numbers | {"outcome": "error"})
    return Outcome.failed(
        f"with a padding mask and {numbers['joint_tokens']} joint tokens (not a multiple of 8)"
        " diffusers hands xformers a tensor bias it rejects; pad the prompt so that image plus"
        " text tokens are a multiple of 8, or use the default attention backend: " + outcome.reason,
        numbers | {"outcome": "rejected"},
    )


#: (training, compiled) -> the use a model check speaks for
_USE: dict[tuple[bool, bool], Use] = {
    (False, False): "inference",
    (False, True): "inference-compiled",
    (True, False): "training",
    (True, True): "training-compiled",
}


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    impls: tuple[Impl, ...] = ("xformers", "sdpa")
    for impl in impls:
        needs = frozenset({"diffusers"} | ({"cuda"} if impl == "xformers" else set()))
        for training in (False, True):
            for compiled in (False, True):
                use = _USE[(training, compiled)]
                spec = CheckSpec(
                    name=f"model.diffusers.qwenimage.{impl}"
                    f".{'training' if training else 'inference'}"
                    f".{'compiled' if compiled else 'eager'}",
                    gate=True,
                    uses=(use,),
                    impl=impl,
                    needs=needs,
                    run=partial(model_check, ctx, impl, compiled, training),
                    # --quick keeps the eager training step (a compiled one costs tens of seconds)
                    quick=training and not compiled,
                )
                if impl == "xformers":
                    workaround: Workaround = "sdpa-under-compile" if compiled else "sdpa-instead"
                    instead = partial(
                        model_check, ctx, "sdpa", compiled, training, workaround=workaround
                    )
                    covering: tuple[CheckSpec, ...] = (
                        spec.covered_by(workaround, instead, "sdpa"),
                    )
                    if compiled:
                        keep = partial(
                            model_check,
                            ctx,
                            "xformers",
                            compiled,
                            training,
                            workaround="dynamo-disable",
                        )
                        covering = (spec.covered_by("dynamo-disable", keep, "xformers"), *covering)
                    spec = replace(spec, workarounds=covering)
                out.append(spec)
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
