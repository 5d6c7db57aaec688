"""A real diffusers model: the Qwen-Image double-stream transformer at a tiny random config.

No weights are downloaded. Its default attention (PyTorch's SDPA, diffusers'
"native" backend) and diffusers' xformers path (``set_attention_backend(
"xformers")`` in current releases, ``enable_xformers_memory_efficient_attention()``
in older ones) run eagerly and compiled, for inference (``eval()``, forward
under ``no_grad``) and for one training step (forward, a loss, backward, an SGD
step). Output, gradients and updated parameters (by parameter name: a None
gradient and an exact-zero one are the same "no gradient", which a graph break
turns one into the other) are compared with the same step in float64, from the
same rounded weights and inputs, under the tolerance rule; the "math path" is
the model with diffusers' ``_native_math`` backend (the textbook attention) run
eagerly in the same dtype. The text stream carries a padding mask, the case
where diffusers hands xformers a tensor bias; the nearest plausible wrong
answer is the model run without that mask, and the padding is long enough for
it to lie at least 4 bounds away (sensitivity rule,
`envbuilder.conformance.tolerance`). A failing xformers check records the
experiments that decide who is at fault (`envbuilder.conformance._counterfactual`,
run eagerly) and is re-run on the same case with the default backend in
xformers' place and, compiled, with the workaround that keeps xformers as users
apply it: the transformer module's ``dispatch_attention_fn`` replaced by itself
behind ``torch.compiler.disable``, so that the compiled transformer breaks its
graph at every attention call and runs xformers eagerly (its cost measured on
the model: compiled regions entered per step and per disabled call). Each
workaround check records the evidence that it was applied
(`envbuilder.conformance._workaround`).

The gate checks use 64 image and 64 text tokens, so the joint sequence (128)
is a multiple of 8. Info checks (no gate) measure what a user meets:
``unaligned_mask`` at 61 text tokens (joint length 125), where diffusers hands
xformers a 4-D bias whose rows are not 8-aligned (it records what was measured
to work: the native backend, and the patched conversion as the upstream fix);
``hit.mask_all_true`` and ``hit.padded``, the model as a pipeline calls it with
prompts of one length (``QwenImagePipeline.encode_prompt`` passes no mask when
it is all True) and with batched prompts of unequal length (a padding mask).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from envbuilder.conformance import _counterfactual, _fault, tolerance
from envbuilder.conformance._context import Context
from envbuilder.conformance._model_step import (
    Difference,
    Step,
    named_difference,
    nonfinite,
    step_differences,
)
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
    count_compiled_regions,
    watching,
    with_evidence,
)
from envbuilder.conformance.plan import (
    ALIGNED_TEXT,
    ATTENTION_GAIN,
    IMAGE_SIDE,
    LEARNING_RATE,
    MODEL_INIT_SEED,
    MODEL_INPUTS_SEED,
    MODEL_LOSS_SEED,
    UNALIGNED_TEXT,
    model_config,
)

__all__ = [
    "Difference",
    "Step",
    "model_check",
    "named_difference",
    "reference_inputs",
    "specs",
    "step_differences",
    "who_is_hit",
]


def _config(ctx: Context) -> dict[str, Any]:
    return model_config(cuda=ctx.is_cuda)


def _model(ctx: Context) -> Any:
    try:
        from diffusers import QwenImageTransformer2DModel
    except ImportError as e:
        raise Skip(f"this diffusers has no QwenImageTransformer2DModel: {e}") from e
    torch.manual_seed(MODEL_INIT_SEED)
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


def _inputs(ctx: Context, dtype: torch.dtype, text: int) -> dict[str, Any]:
    cfg = _config(ctx)
    batch, h, w = 2, IMAGE_SIDE, IMAGE_SIDE
    gen = torch.Generator(device="cpu").manual_seed(MODEL_INPUTS_SEED)
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


def _loss_weights(out_shape: torch.Size, device: str) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(MODEL_LOSS_SEED)
    return torch.randn(*out_shape, generator=gen, dtype=torch.float64).to(device)


def _step(model: Any, runner: Any, inputs: dict[str, Any], training: bool) -> Step:
    """An inference forward, or one training step; what the check compares, in float64."""
    if not training:
        model.eval()
        with torch.no_grad():
            out: torch.Tensor = runner(**inputs)[0]
        return Step(output=out.detach().double())
    model.train()
    model.zero_grad(set_to_none=True)
    out = runner(**inputs)[0]
    (out.double() * _loss_weights(out.shape, str(out.device))).sum().backward()
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    grads: dict[str, torch.Tensor | None] = {
        name: None if p.grad is None else p.grad.detach().double().clone()
        for name, p in params.items()
    }
    torch.optim.SGD(list(params.values()), lr=LEARNING_RATE).step()
    updated: dict[str, torch.Tensor | None] = {
        name: p.detach().double().clone() for name, p in params.items()
    }
    return Step(output=out.detach().double(), gradients=grads, updated=updated)


def reference_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The model's inputs for the float64 reference: the low-precision inputs, rounded as
    they are, widened (the tolerance rule's "from the same rounded inputs")."""
    return {
        key: value.double()
        if isinstance(value, torch.Tensor) and value.is_floating_point()
        else value
        for key, value in inputs.items()
    }


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


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    """One model case ready to run: the rounded model and inputs, the float64 reference,
    the low-precision math path and (with a padding mask) the model without its mask."""

    low: Any
    inputs: dict[str, Any]
    dtype: torch.dtype
    training: bool
    expected: Step
    math_path: Step
    wrong: Step | None

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def variant(self, backend: str, dtype: torch.dtype | None = None) -> Any:
        model = copy.deepcopy(self.low).to(dtype or self.dtype)
        _set_backend(model, backend)
        return model

    def eager(self, backend: str) -> Callable[[], Step]:
        """One eager step of a fresh copy of the model on ``backend``."""

        def run() -> Step:
            model = self.variant(backend)
            return _step(model, model, self.inputs, self.training)

        return run

    def comparisons(
        self, got: Step, *, k: float = tolerance.K
    ) -> tuple[list[tolerance.Comparison], list[str]]:
        """``got`` against the reference under the tolerance rule at ``k`` (`tolerance.factor`;
        sensitivity 0 when the case has no mask to drop), and the problems that keep a
        quantity from comparing."""
        problems: list[str] = []
        comparisons: list[tolerance.Comparison] = []
        ours = step_differences(got, self.expected)
        maths = step_differences(self.math_path, self.expected)
        wrongs = step_differences(self.wrong, self.expected) if self.wrong is not None else {}
        for name, value in got.quantities().items():
            bad = nonfinite(value)
            if bad:
                problems.append(f"{bad} NaN/inf values in the {name}")
                continue
            difference = ours[name]
            if difference.problems:
                problems.extend(difference.problems)
                continue
            wrong = wrongs.get(name)
            comparisons.append(
                tolerance.compare(
                    name,
                    difference.error,
                    maths[name].error,
                    self.dtype_name,
                    wrong.error if wrong is not None else 0.0,
                    k=k,
                )
            )
        return comparisons, problems

    def worst(self, got: Step) -> tuple[str, float, float]:
        """The quantity of ``got`` worst against its bound (`_counterfactual`'s judge)."""
        comparisons, problems = self.comparisons(got)
        if problems or not comparisons:
            return (problems or ["nothing compared"])[0], math.nan, math.nan
        worst = max(comparisons, key=lambda c: c.ratio)
        return worst.what, worst.error, worst.bound


def _prepare(ctx: Context, training: bool, text: int, *, padded: bool = True) -> _Prepared:
    # fp16 on a GPU: in bf16 the model's own rounding (3 x the math path's error) hides
    # the mask (the model without it lay at 2 bounds); fp16's 3 more bits leave it at 8
    dtype = torch.float16 if ctx.is_cuda else torch.float32
    low = _model(ctx).to(ctx.device, dtype)
    inputs = _inputs(ctx, dtype, text)
    if not padded:  # prompts of one length: the pipeline passes no mask at all
        inputs["encoder_hidden_states_mask"] = None
    inputs64 = reference_inputs(inputs)

    def run(backend: str, dtype: torch.dtype, given: dict[str, Any]) -> Step:
        model = copy.deepcopy(low).to(dtype)
        _set_backend(model, backend)
        return _step(model, model, given, training)

    wrong = None
    if padded:
        wrong = run("native", torch.float64, inputs64 | {"encoder_hidden_states_mask": None})
    return _Prepared(
        low=low,
        inputs=inputs,
        dtype=dtype,
        training=training,
        expected=run("native", torch.float64, inputs64),
        math_path=run("_native_math", dtype, inputs),
        wrong=wrong,
    )


def model_check(
    ctx: Context,
    impl: Impl,
    compiled: bool,
    training: bool,
    *,
    text: int = ALIGNED_TEXT,
    padded: bool = True,
    workaround: Workaround | None = None,
) -> Outcome:
    """One model case; with ``workaround``, that workaround's check (``dynamo-disable``
    disables ``impl``'s attention dispatch inside the compiled transformer). ``padded``
    False: prompts of one length, no mask passed (judged by the bound alone: there is no
    mask to drop). A failing xformers-backend case runs the experiments that decide who
    is at fault (`envbuilder.conformance._counterfactual`, eagerly)."""
    case = _prepare(ctx, training, text, padded=padded)
    backend = "xformers" if impl == "xformers" else "native"
    model = case.variant(backend)
    numbers = _described(ctx, case, backend, compiled=compiled, text=text)
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
    seen = _Seen(disabled=disabled, workaround=workaround)
    try:
        with patched:
            # compiled: the first step compiles
            got = _run_steps(ctx, case, model, runner, seen, steps=3 if compiled else 2)
    except Skip:
        raise
    except Exception as e:  # the backend or the compiler refusing the model is the finding
        breaks = int(sum(counters["graph_break"].values()) - breaks_before)
        failed = Outcome.failed(describe_error(e), numbers | _fault.error_fault(e))
        return with_evidence(failed, workaround, disabled, breaks, seen.xformers_calls[0])
    numbers["step_ms"] = round(statistics.median(seen.times[1:]) * 1000, 3)
    breaks = int(sum(counters["graph_break"].values()) - breaks_before)
    numbers["graph_breaks"] = breaks
    cost = _disable_cost(seen) if disabled is not None else {}
    outcome = _judged(ctx, case, got, numbers, compiled=compiled)
    if outcome.status == "fail":
        subject = f"diffusers {backend} backend, {'compiled ' if compiled else ''}model"
        outcome = _failed(
            ctx, case, outcome, subject, attributing=impl == "xformers" and workaround is None
        )
    return with_evidence(outcome, workaround, disabled, breaks, seen.xformers_calls[0], **cost)


def _described(
    ctx: Context, case: _Prepared, backend: str, *, compiled: bool, text: int
) -> dict[str, Number]:
    """What a model check runs: the model, diffusers, the config, dtype, backend and use,
    and the tokens (joint, and padding among the text's)."""
    mask = case.inputs["encoder_hidden_states_mask"]
    return {
        "model": type(case.low).__name__,
        "diffusers": _diffusers_version(),
        "config": str(_config(ctx)),
        "dtype": case.dtype_name,
        "backend": backend,
        "compiled": compiled,
        "training": case.training,
        "joint_tokens": case.inputs["hidden_states"].shape[1] + text,
        "padded_text_tokens": 0 if mask is None else int((~mask).sum()),
    }


@dataclass(kw_only=True)
class _Seen:
    """What the timed steps of a model check saw, kept as they go (a step that raises
    leaves what came before it): the times, a workaround's evidence, and behind the
    disable the compiled regions entered and the disabled calls made in the last step."""

    disabled: Disabled | None
    workaround: Workaround | None
    times: list[float] = field(default_factory=list)
    xformers_calls: list[int] = field(default_factory=lambda: [0])
    regions: list[int] = field(default_factory=lambda: [0])
    calls_in_step: int = 0


def _run_steps(
    ctx: Context, case: _Prepared, model: Any, runner: Any, seen: _Seen, *, steps: int
) -> Step:
    """``steps`` steps of ``runner`` on the case's inputs, each from the same weights; the
    first gathers a workaround's evidence (untimed for ``step_ms``), the last (compiled
    already) measures what a disabled call costs. Returns the last step's result."""
    disabled, training = seen.disabled, case.training
    for step in range(steps):
        stepped = copy.deepcopy(model) if training else model
        # the last step (compiled already) of a disabled call measures its cost
        costing = disabled is not None and step == steps - 1
        calls_before = disabled.calls if disabled is not None else 0
        t0 = time.perf_counter()
        # the first step (untimed for step_ms) gathers the workaround's evidence
        with (
            watching(disabled, seen.workaround, seen.xformers_calls, first=step == 0),
            count_compiled_regions(seen.regions) if costing else contextlib.nullcontext(),
        ):
            got = _step(model, runner, case.inputs, training)
        if ctx.is_cuda:
            torch.cuda.synchronize(ctx.device)
        seen.times.append(time.perf_counter() - t0)
        if costing and disabled is not None:
            seen.calls_in_step = disabled.calls - calls_before
        if training:  # every step starts from the same weights
            model.load_state_dict(stepped.state_dict())
    return got


def _disable_cost(seen: _Seen) -> dict[str, Any]:
    """What the disabled attention call cost the compiled model, from dynamo's counters and
    the last step's compiled regions."""
    from torch._dynamo.utils import counters

    # a compiled step enters one compiled region, and one more per break crossed
    per_step = max(seen.regions[0] - 1, 0)
    calls = seen.calls_in_step
    return {
        "break_reasons": " || ".join(" ".join(r.split()) for r in counters["graph_break"]),
        "graphs_compiled": int(counters["stats"]["unique_graphs"]),
        "drops_fullgraph": False,  # the model is compiled as users compile it, not fullgraph
        "graph_breaks_per_step": per_step,
        "graph_breaks_per_call": round(per_step / calls, 3) if calls else None,
    }


def _judged(
    ctx: Context, case: _Prepared, got: Step, numbers: dict[str, Number], *, compiled: bool
) -> Outcome:
    """The step against the float64 reference under the tolerance rule (the sensitivity
    rule too where the case has a padding mask to drop), each quantity's NaN/inf values
    and worst parameter recorded."""
    for name, difference in step_differences(got, case.expected).items():
        numbers[f"{name.replace(' ', '_')}_nonfinite"] = nonfinite(got.quantities()[name])
        if difference.worst is not None:
            numbers[f"{name.replace(' ', '_')}_worst_parameter"] = difference.worst
    # compiled on CPU, float32 is summed in inductor's order: its own measured bound
    k, rule = tolerance.factor(cuda=ctx.is_cuda, compiled=compiled)
    comparisons, problems = case.comparisons(got, k=k)
    if case.wrong is not None:
        return tolerance.assess(
            comparisons,
            wrong="the model without its padding mask",
            problems=problems,
            numbers=numbers,
            rule=rule,
        )
    return _bounded(comparisons, problems, numbers, rule=rule)


def _failed(
    ctx: Context, case: _Prepared, outcome: Outcome, subject: str, *, attributing: bool
) -> Outcome:
    """A failed model check with its cause; ``attributing`` (a direct xformers-backend
    check whose numbers are wrong) with the experiments that decide who is at fault."""
    found = dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject)
    if attributing and "error" in found:
        found |= _counterfactual.counterfactuals(
            case.eager("xformers"), case.worst, kernel=_counterfactual.real_kernel(ctx.device)
        )
        found["cf_mode"] = "eager"
    return Outcome.failed(outcome.reason, found)


def _bounded(
    comparisons: list[tolerance.Comparison],
    problems: list[str],
    numbers: dict[str, Number],
    *,
    rule: str = tolerance.RULE,
) -> Outcome:
    """Pass when every comparison is within its bound (no sensitivity: nothing to drop)."""
    found = list(problems) + [
        f"{c.what} error {c.error:.3g} > bound {c.bound:.3g}" for c in comparisons if not c.ok
    ]
    recorded = dict(numbers) | {"rule": rule}
    if comparisons:
        worst = max(comparisons, key=lambda c: c.ratio)
        recorded |= {"error": worst.error, "bound": worst.bound, "worst": worst.what}
    return Outcome.judge(found or ([] if comparisons else ["nothing was compared"]), recorded)


def who_is_hit(ctx: Context, padded: bool) -> Outcome:
    """Whether diffusers' xformers backend is right for the Qwen-Image model as pipelines
    call it (info): prompts of one length (their mask all True, which
    ``QwenImagePipeline.encode_prompt`` turns into no mask) or batched prompts of unequal
    length (a padding mask). ``hit``: whether the output is wrong."""
    outcome = model_check(ctx, "xformers", False, False, padded=padded)
    numbers = dict(outcome.numbers) | {
        "prompt_mask": "padding (batched prompts of unequal length)"
        if padded
        else "all True (the pipeline passes None)",
        "hit": outcome.status != "pass",
    }
    if outcome.status == "pass":
        return Outcome.passed(numbers)
    return Outcome.failed(f"hit: {outcome.reason}", numbers)


def unaligned_mask(ctx: Context) -> Outcome:
    """diffusers' xformers path at a joint length that is not a multiple of 8 (info).

    Passes when the output is right; fails naming what happened when xformers rejects
    the bias diffusers built (with what was measured to work: the native backend, and
    the patched conversion as the upstream fix) or when the output is wrong.
    """
    outcome = model_check(ctx, "xformers", False, False, text=UNALIGNED_TEXT)
    numbers = dict(outcome.numbers)
    if outcome.status == "pass":
        return Outcome.passed(numbers | {"outcome": "handled"})
    if "error" in numbers:  # it ran: the numbers are wrong (or could not be told apart)
        return Outcome.failed(outcome.reason, numbers | {"outcome": "silently-wrong"})
    if "NotImplementedError" not in outcome.reason:  # not xformers turning the inputs down
        return Outcome.failed(outcome.reason, numbers | {"outcome": "error"})
    measured = _unaligned_experiments(ctx)
    said = f"diffusers' native backend here: {measured['native_backend']}"
    if measured.get("upstream_fix"):
        said += (
            f"; the patched conversion (evidence for an upstream fix, not advice):"
            f" {measured['cf_patched_glue']}"
        )
    return Outcome.failed(
        f"with a padding mask and {numbers['joint_tokens']} joint tokens diffusers' xformers"
        " backend hands xformers a 4-D tensor bias whose rows are not 8-aligned in storage,"
        f" which xformers rejects; measured: {said}: {outcome.reason}",
        numbers | measured | {"outcome": "rejected"},
    )


def _unaligned_experiments(ctx: Context) -> dict[str, Number]:
    """What works on the unaligned case: the native backend, and the xformers backend with
    its 4-D mask conversion patched (`_counterfactual.glue_patched`) on the real kernel."""
    case = _prepare(ctx, False, UNALIGNED_TEXT)
    native = _counterfactual.trial(case.eager("native"), case.worst)
    found: dict[str, Number] = {"native_backend": native.said[:300]}
    if native.error is not None:
        found["native_backend_error"] = native.error
    kernel = _counterfactual.real_kernel(ctx.device)
    if isinstance(kernel, str):
        found["cf_patched_glue"] = kernel
        return found
    aligned: list[bool] = []
    with _counterfactual.glue_patched(aligned):
        glue = _counterfactual.trial(case.eager("xformers"), case.worst)
    found["cf_patched_glue"] = glue.said[:300]
    if glue.error is not None:
        found["cf_patched_glue_error"] = glue.error
    if glue.right:
        fix = _counterfactual.UPSTREAM_FIX + (_counterfactual.ALIGN_FIX if aligned else "")
        found["upstream_fix"] = fix
    return found


#: (training, compiled) -> the use a model check speaks for
_USE: dict[tuple[bool, bool], Use] = {
    (False, False): "inference",
    (False, True): "inference-compiled",
    (True, False): "training",
    (True, True): "training-compiled",
}

#: the info checks of who is hit: name -> whether the prompts carry a padding mask
HIT: dict[str, bool] = {"mask_all_true": False, "padded": True}


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
                    via="diffusers",
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
    info = frozenset({"diffusers", "cuda"})
    out.append(
        CheckSpec(
            name="model.diffusers.qwenimage.xformers.unaligned_mask",
            gate=False,
            impl="xformers",
            via="diffusers",
            needs=info,
            run=partial(unaligned_mask, ctx),
            quick=False,
        )
    )
    for label, padded in HIT.items():
        out.append(
            CheckSpec(
                name=f"model.diffusers.qwenimage.xformers.hit.{label}",
                gate=False,
                impl="xformers",
                via="diffusers",
                needs=info,
                run=partial(who_is_hit, ctx, padded),
                quick=False,
            )
        )
    return out
