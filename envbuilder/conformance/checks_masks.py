"""Attention masks in the forms users hand diffusers, through each attention backend.

A diffusers model hands its attention mask to ``dispatch_attention_fn``, which
gives it to the chosen backend; each backend converts the forms it accepts in
its own way. These checks call ``dispatch_attention_fn(q, k, v, attn_mask=...,
backend=...)`` directly, for the ``native`` backend (PyTorch's SDPA, the
default) and the ``xformers`` backend, with each mask form:

- ``bool2d``: a ``[B,N]`` boolean key mask (True: attend), as pipelines pass a
  prompt's padding;
- ``bool4d_b11n``: the same as ``[B,1,1,N]`` boolean;
- ``bool4d_b1mn``: a ``[B,1,M,N]`` boolean mask that differs per query row
  (key padding and a random pattern; every row keeps its first key);
- ``additive``: a ``[B,1,M,N]`` float bias (random where attended, the
  dtype's lowest value where masked), as transformers-style code builds it.

Output and the gradients of q, k and v (forward, then backward of a fixed
random gradient: ``uses`` inference and training) are compared with float64
attention under the same mask (tolerance rule: the math path is the textbook
attention in the same dtype), and the nearest plausible wrong answer is the
mask dropped (sensitivity rule, `envbuilder.conformance.tolerance`): a backend
that misreads a form (diffusers 0.42.1's xformers backend turns a 4-D boolean
mask into a bias with ``.type_as(query)``, True -> +1.0, so padding is seen)
fails its check. A failing xformers-backend check runs the experiments that
decide who is at fault (`envbuilder.conformance._counterfactual`: the kernel
swapped for exact float64 attention inside diffusers' wrapper, the kernel
called directly with a correct bias, the wrapper's 4-D conversion patched) and
is re-run on its case with the native backend (``sdpa-instead``, which records
that xformers never ran) and, for a 4-D boolean mask, with the xformers backend
kept and the same mask handed in a form diffusers converts correctly
(``mask-form``: ``bool4d_b11n`` as the ``[B,N]`` boolean mask, ``bool4d_b1mn``
as an additive 0/-inf float mask; evidence: xformers' operators ran).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, TypeAlias

import torch

from envbuilder.conformance import _counterfactual, _fault, tolerance
from envbuilder.conformance._attn import DTYPES, Case, make_inputs, max_abs_error, nonfinite
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import (
    CheckSpec,
    Impl,
    Number,
    Outcome,
    Workaround,
    describe_error,
)
from envbuilder.conformance._workaround import count_xformers_calls, replaced_evidence, settle
from envbuilder.conformance.plan import (
    FORMS,
    MASKS_PATTERN_KEEP,
    MASKS_PATTERN_SEED,
    MASKS_SEED,
    Form,
    masks_case,
)

__all__ = [
    "BACKENDS",
    "FORMS",
    "HANDED",
    "Backend",
    "Form",
    "MaskedInputs",
    "handed_mask",
    "kept_evidence",
    "mask_check",
    "specs",
]

Backend: TypeAlias = Literal["native", "xformers"]

#: diffusers' backend name -> the implementation it runs
BACKENDS: dict[Backend, Impl] = {"native": "sdpa", "xformers": "xformers"}

#: how a form is named in a cause: the forms one conversion handles alike share it
_FAMILY: dict[Form, str] = {
    "bool2d": "2-D boolean mask",
    "bool4d_b11n": "4-D boolean mask",
    "bool4d_b1mn": "4-D boolean mask",
    "additive": "additive float mask",
}


#: the seeds and the pattern's share kept, as the plan says them (`plan.MASKS_SEED`)
SEED = MASKS_SEED
MASK_SEED = MASKS_PATTERN_SEED
PATTERN_KEEP = MASKS_PATTERN_KEEP


def _case(ctx: Context) -> Case:
    return masks_case(cuda=ctx.is_cuda)


@dataclass(frozen=True, kw_only=True)
class MaskedInputs:
    """q, k, v (BMHK, rounded to the dtype), the mask handed to diffusers, and what it
    means: ``allowed`` ``[B,1,M,N]`` (True: attend) and ``bias`` ``[B,1,M,N]`` added
    to the allowed scores (zero but for the additive form)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad: torch.Tensor
    attn_mask: torch.Tensor
    allowed: torch.Tensor
    bias: torch.Tensor
    case: Case


def masked_inputs(ctx: Context, form: Form, dtype: torch.dtype) -> MaskedInputs:
    case = _case(ctx)
    inp = make_inputs(case, dtype, ctx.device, seed=SEED)
    gen = torch.Generator(device="cpu").manual_seed(MASK_SEED)
    keep = torch.ones(case.B, case.N, dtype=torch.bool)
    for b in range(case.B):  # a third, then a half of the keys are padding
        keep[b, case.N - case.padded(b) :] = False
    allowed = keep[:, None, None, :].expand(case.B, 1, case.M, case.N)
    bias = torch.zeros(case.B, 1, case.M, case.N)
    if form == "bool2d":
        attn_mask = keep
    elif form == "bool4d_b11n":
        attn_mask = keep[:, None, None, :]
    elif form == "bool4d_b1mn":
        pattern = torch.rand(case.B, 1, case.M, case.N, generator=gen) < PATTERN_KEEP
        pattern[..., 0] = True
        allowed = allowed & pattern
        attn_mask = allowed
    else:
        bias = torch.randn(case.B, 1, case.M, case.N, generator=gen).to(dtype).float()
        attn_mask = bias.to(dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    grad = torch.randn(case.B, case.M, case.H, case.K, generator=gen).to(dtype)
    return MaskedInputs(
        q=inp.q,
        k=inp.k,
        v=inp.v,
        grad=grad.to(ctx.device),
        attn_mask=attn_mask.contiguous().to(ctx.device),
        allowed=allowed.contiguous().to(ctx.device),
        bias=bias.to(ctx.device),
        case=case,
    )


def _textbook(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Attention in the inputs' dtype (BMHK), with the mask's meaning applied."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    scores = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    return (scores.softmax(dim=-1) @ vh).transpose(1, 2)


def _run(fn: Any, inp: MaskedInputs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Output and q, k, v gradients of ``fn(q, k, v)`` on ``inp`` cast to ``dtype``."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    out = fn(q, k, v)
    out.backward(inp.grad.to(out.dtype))
    found = {"out": out.detach()}
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert t.grad is not None, f"no gradient reached {name}"
        found[name] = t.grad.detach()
    return found


#: the 4-D boolean forms and the form ``mask-form`` hands diffusers instead: the same mask
#: that diffusers' xformers backend converts correctly (the ``[B,N]`` boolean where the mask
#: is a key mask, else an additive 0/-inf float mask)
HANDED: dict[Form, str] = {"bool4d_b11n": "bool2d", "bool4d_b1mn": "additive 0/-inf"}


def handed_mask(inp: MaskedInputs, form: Form, dtype: torch.dtype) -> torch.Tensor:
    """``inp``'s mask in the form ``mask-form`` hands diffusers for ``form`` (`HANDED`)."""
    if form == "bool4d_b11n":
        return inp.attn_mask[:, 0, 0, :].contiguous()
    if form == "bool4d_b1mn":
        additive = torch.zeros(inp.allowed.shape, dtype=dtype, device=inp.allowed.device)
        return additive.masked_fill(~inp.allowed, -math.inf)
    raise ValueError(f"no other form for the {form!r} mask; known: {sorted(HANDED)}")


def kept_evidence(xformers_calls: int) -> tuple[bool, str]:
    """Whether the xformers backend really ran xformers (``mask-form``), and what shows it."""
    if xformers_calls < 1:
        return False, "no xformers operator ran in the evidence step (profiler)"
    return True, f"{xformers_calls} xformers operator call(s) in the evidence step (profiler)"


def _dispatch(backend: Backend, attn_mask: torch.Tensor) -> Any:
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    name = AttentionBackendName(backend)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = dispatch_attention_fn(q, k, v, attn_mask=attn_mask, backend=name)
        return out

    return fn


def _diffusers_version() -> str:
    import diffusers

    return str(getattr(diffusers, "__version__", "unknown"))


def mask_check(
    ctx: Context,
    backend: Backend,
    form: Form,
    dtype_name: str,
    *,
    workaround: Workaround | None = None,
) -> Outcome:
    """One mask form through one backend, against float64; with ``workaround``
    (``sdpa-instead``: the native backend in xformers' place; ``mask-form``: the xformers
    backend handed the same mask in the form `HANDED` names) its evidence too. A failing
    xformers-backend check records the experiments deciding who is at fault."""
    dtype = DTYPES[dtype_name]
    inp = masked_inputs(ctx, form, dtype)
    attn_mask = inp.attn_mask
    numbers: dict[str, Number] = {}
    if workaround == "mask-form":
        attn_mask = handed_mask(inp, form, dtype)
        numbers["handed_form"] = HANDED[form]
    numbers |= {
        "backend": backend,
        "form": form,
        "mask_shape": "x".join(str(n) for n in attn_mask.shape),
        "mask_dtype": str(attn_mask.dtype).removeprefix("torch."),
        "dtype": dtype_name,
        "case": inp.case.label,
        "seed": SEED,
        "mask_seed": MASK_SEED,
        "masked_keys_fraction": round(1.0 - float(inp.allowed.float().mean()), 4),
        "diffusers": _diffusers_version(),
    }
    subject = f"diffusers {backend} backend, {_FAMILY[form]}"
    expected = _run(lambda q, k, v: _textbook(q, k, v, inp.allowed, inp.bias), inp, torch.float64)
    wrong = _run(lambda q, k, v: _textbook(q, k, v, None, None), inp, torch.float64)
    low_bias = inp.bias.to(dtype)
    math_path = _run(lambda q, k, v: _textbook(q, k, v, inp.allowed, low_bias), inp, dtype)
    xformers_calls = [0]
    counting = (
        count_xformers_calls(xformers_calls) if workaround is not None else contextlib.nullcontext()
    )
    try:
        with counting:
            got = _run(_dispatch(backend, attn_mask), inp, dtype)
    except Exception as e:  # the backend refusing the mask form is the finding
        failed = Outcome.failed(describe_error(e), numbers | _fault.error_fault(e))
        return _with_evidence(failed, workaround, xformers_calls[0])
    problems: list[str] = []
    comparisons: list[tolerance.Comparison] = []
    for name, value in got.items():
        bad = nonfinite(value)
        if bad:
            problems.append(f"{bad} NaN/inf values in {name}")
            continue
        comparisons.append(
            tolerance.compare(
                name,
                max_abs_error(value, expected[name]),
                max_abs_error(math_path[name], expected[name]),
                str(dtype).removeprefix("torch."),
                max_abs_error(wrong[name], expected[name]),
            )
        )
    outcome = tolerance.assess(
        comparisons, wrong="the mask dropped", problems=problems, numbers=numbers
    )
    if outcome.status == "fail":
        found = dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject)
        if backend == "xformers" and workaround is None and "error" in found:
            reference = _counterfactual.Reference(
                expected=expected, bounds={c.what: c.bound for c in comparisons}
            )
            found |= _counterfactual.counterfactuals(
                lambda: _run(_dispatch("xformers", attn_mask), inp, dtype),
                reference.worst,
                kernel=_counterfactual.real_kernel(ctx.device),
            )
        outcome = Outcome.failed(outcome.reason, found)
    return _with_evidence(outcome, workaround, xformers_calls[0])


def _with_evidence(outcome: Outcome, workaround: Workaround | None, xformers_calls: int) -> Outcome:
    if workaround is None:
        return outcome
    if workaround == "mask-form":
        applied, evidence = kept_evidence(xformers_calls)
    else:
        applied, evidence = replaced_evidence(xformers_calls)
    return settle(outcome, applied, evidence, {"xformers_calls": xformers_calls})


def _dtypes(ctx: Context) -> tuple[str, ...]:
    return ("fp16", "bf16") if ctx.is_cuda else ("fp32",)


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    quick_dtype = "bf16" if ctx.is_cuda else "fp32"
    backend: Backend
    for backend, impl in BACKENDS.items():
        needs = frozenset({"diffusers"} | ({"cuda"} if impl == "xformers" else set()))
        for form in FORMS:
            for dtype_name in _dtypes(ctx):
                spec = CheckSpec(
                    name=f"masks.{backend}.{form}.{dtype_name}",
                    gate=True,
                    uses=("inference", "training"),
                    impl=impl,
                    via="diffusers",
                    needs=needs,
                    run=partial(mask_check, ctx, backend, form, dtype_name),
                    quick=dtype_name == quick_dtype,
                )
                if backend == "xformers":
                    instead = partial(
                        mask_check, ctx, "native", form, dtype_name, workaround="sdpa-instead"
                    )
                    covering: tuple[CheckSpec, ...] = (
                        spec.covered_by("sdpa-instead", instead, "sdpa"),
                    )
                    if form in HANDED:
                        kept = partial(
                            mask_check, ctx, "xformers", form, dtype_name, workaround="mask-form"
                        )
                        covering = (spec.covered_by("mask-form", kept, "xformers"), *covering)
                    spec = replace(spec, workarounds=covering)
                out.append(spec)
    return out
