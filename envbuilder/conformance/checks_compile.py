"""torch.compile around attention, over every mask kind: graph breaks, recompiles,
and output and gradients against float64.

For xformers and for SDPA, the attention function of each mask kind (none,
causal, block-diagonal from sequence lengths, a dense ``[B,H,M,N]`` bias, a
key-padding bias built from a boolean mask, ``[B,1,M,N]`` as it is and
expanded) is compiled with inductor (``dynamic=False``/``True``, ``fullgraph``
on/off) with the mask built inside the compiled code, as a model builds it.
Each compilation is shared by the checks of its (implementation, mask kind,
dynamic, fullgraph): fp16 and bf16 (fp32 on CPU) × forward under ``no_grad``
(inference-compiled) and forward + backward (training-compiled), gradients of
q, k, v and of a dense bias, each against float64 under the tolerance rule
(the math path: the textbook attention in the same dtype, eagerly) and the
sensitivity rule (the mask dropped must lie at least 4 bounds away).

A check fails on an error above its bound, on NaN/inf, on a graph break
(``fullgraph`` checks: the compiler refuses; ``nobreaks`` checks, compiled
with ``fullgraph=False`` so that torch would split the graph silently: any
split dynamo reports), on more compilations than the shapes explain (static:
one per shape; dynamic: one for every shape) or on any compilation when the
same shapes run again (recompiling without end). A failing xformers check is
re-run on its exact case with each workaround, applied as users apply it
(`envbuilder.conformance._workaround`), cheapest first: for a bias object
(causal, block-diagonal), the object built outside the compiled function and
passed in, compiled with the check's own ``fullgraph`` (``mask-outside-compile``);
a compiled attention layer (an input projection, the mask built as the direct
check builds it, the xformers call wrapped in ``torch.compiler.disable``, an
output projection: a graph break by design, so compiled without ``fullgraph``,
which ``drops_fullgraph`` records); and SDPA in xformers' place. Each records
its graph breaks (per call and per step for the disable), the median time of
one step and the evidence that it was applied. The projections are by a
permutation (exact in every dtype, and q and k permuted alike leave the scores
unchanged), so the numbers compare with the direct check's.

A failing xformers check runs the experiments that decide who is at fault
(`envbuilder.conformance._compile_fault`, on `envbuilder.conformance._glue`): for a
bias object, the same attention with the object built outside and
``fullgraph=True``; for FakeTensor device propagation in an ``aten`` operator, that
operator alone with the arguments xformers passed it.

The compiled function and what dynamo records about it are
`envbuilder.conformance._compiled_fn`; what watches a workaround check and settles
it by its evidence, `envbuilder.conformance._compile_evidence`; the
``torch.library.opcheck`` info check, `envbuilder.conformance._opcheck`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import torch

from envbuilder.conformance import _compile_fault, _dropout, _fault, plan, tolerance
from envbuilder.conformance._attn import (
    BIAS_OBJECTS,
    DTYPES,
    MASKS,
    Case,
    MaskKind,
    attention_fn,
    make_inputs,
    outside_bias,
    run_attention,
    sdpa_on_bias,
    split_fn,
    wants_bias_grad,
    xformers_call,
)
from envbuilder.conformance._compile_evidence import settle, unwatched, watcher
from envbuilder.conformance._compiled_fn import (
    Compiled,
    Found,
    counting_backend,
    graph_breaks,
    guard_failures,
    raise_compile_limits,
    shapes,
)
from envbuilder.conformance._context import Context
from envbuilder.conformance._opcheck import opcheck_xformers
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
    Kernel,
    count_compiled_regions,
    projected,
)
from envbuilder.conformance.checks_attention import compare_attention, grad_out

__all__ = ["compile_check", "opcheck_xformers", "shapes", "specs"]

#: the attention code that is compiled: an implementation, an attention layer calling
#: xformers behind ``torch.compiler.disable`` (the ``dynamo-disable`` workaround), or
#: xformers called with a bias object built outside and passed in (``mask-outside-compile``).
Variant = Literal["xformers", "sdpa", "dynamo-disable", "mask-outside-compile"]


def _compiled(
    ctx: Context,
    variant: Variant,
    mask: MaskKind,
    dynamic: bool,
    fullgraph: bool,
    inner: Kernel = "xformers",
) -> Compiled:
    key = f"compiled/{variant}/{inner}/{mask}/{dynamic}/{fullgraph}"
    if key not in ctx.cache:
        raise_compile_limits()
        counter = [0]
        disabled: Disabled | None = None
        call = xformers_call if inner == "xformers" else sdpa_on_bias
        if variant == "dynamo-disable":
            # the mask is built in the compiled layer, as a model builds it; only the
            # attention call is disabled
            disabled = Disabled(kernel=inner)
            attention = projected(split_fn(mask, disabled.wrap(call)))
        elif variant == "mask-outside-compile":
            attention = _bias_passed_in(call)
        elif variant == "xformers":
            attention = split_fn(mask, call)  # attention_fn("xformers", mask) for xformers
        else:
            attention = attention_fn(variant, mask)
        fn = torch.compile(
            attention, backend=counting_backend(counter), dynamic=dynamic, fullgraph=fullgraph
        )
        # closures of one factory share their code object: versions are counted as deltas
        ctx.cache[key] = Compiled(
            fn=fn, code=attention.__code__, compilations=counter, disabled=disabled
        )
    compiled: Compiled = ctx.cache[key]
    return compiled


def _bias_passed_in(call: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """xformers' attention taking a bias object its caller built outside compiled code."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any) -> torch.Tensor:
        return call(q, k, v, bias)

    return attention


def _sync(ctx: Context) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)


@dataclass(kw_only=True)
class _Run:
    """One compile check as it runs: its case, where dynamo's records stood before it, and
    what its passes gathered so far (a pass that raises leaves what came before it)."""

    ctx: Context
    variant: Variant
    mask: MaskKind
    dynamic: bool
    dtype_name: str
    backward: bool
    workaround: Workaround | None
    inner: Kernel
    compiled: Compiled
    cases: list[Case]
    numbers: dict[str, Number]
    breaks_before: Counter[str]
    failures_before: int
    compiles_before: int
    versions_before: int
    xformers_calls: list[int] = field(default_factory=lambda: [0])
    times: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    comparisons: list[tolerance.Comparison] = field(default_factory=list)
    wrong: str = ""
    #: versions compiled and graphs compiled by the first pass (set when the second begins)
    first_pass: int = 0
    graphs: int = 0
    #: what one step costs behind the disable: breaks crossed, disabled calls made
    step_breaks: int = 0
    step_calls: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def mask_of(self) -> Impl:
        """The mask argument: SDPA's own, else xformers' (a bias object passed in, or the
        input the bias is built from)."""
        return "sdpa" if self.variant == "sdpa" else "xformers"

    @property
    def attributing(self) -> bool:
        """Whether a failure runs the experiments that decide who is at fault."""
        return self.variant == "xformers" and self.workaround is None


def compile_check(
    ctx: Context,
    variant: Variant,
    mask: MaskKind,
    dynamic: bool,
    fullgraph: bool,
    dtype_name: str,
    backward: bool,
    *,
    workaround: Workaround | None = None,
    inner: Kernel = "xformers",
) -> Outcome:
    """One compiled case; with ``workaround`` it is that workaround's check and records the
    evidence that it was applied (``fullgraph``: the covered check's). ``inner`` is the
    kernel that xformers' attention code calls (xformers; SDPA taking xformers' bias
    objects where xformers cannot run, for testing).
    A failing direct xformers check runs the experiments that decide who is at fault."""
    covered_fullgraph = fullgraph
    if variant == "dynamo-disable":
        fullgraph = False  # a disabled function is a graph break: fullgraph refuses it
    kernel: Impl = "sdpa" if variant == "sdpa" or inner == "sdpa" else "xformers"
    compiled = _compiled(ctx, variant, mask, dynamic, fullgraph, inner)
    cases = shapes(ctx, mask, dynamic)
    numbers: dict[str, Number] = {
        "attention": variant,
        "mask": mask,
        "dtype": dtype_name,
        "backward": backward,
        "dynamic": dynamic,
        "fullgraph": fullgraph,
        "shapes": " ".join(c.label for c in cases),
    }
    if mask == "bias_b1mn" and kernel == "xformers":
        _refuse_what_eager_rejects(kernel, mask, cases[0], DTYPES[dtype_name], ctx)
    run = _Run(
        ctx=ctx,
        variant=variant,
        mask=mask,
        dynamic=dynamic,
        dtype_name=dtype_name,
        backward=backward,
        workaround=workaround,
        inner=inner,
        compiled=compiled,
        cases=cases,
        numbers=numbers,
        breaks_before=graph_breaks(),
        failures_before=len(guard_failures(compiled.code)),
        compiles_before=compiled.compilations[0],
        versions_before=compiled.versions(),
    )
    disabled = compiled.disabled
    if disabled is not None:
        disabled.calls = disabled.ops = 0
    evidence_of = partial(
        settle,
        workaround=workaround,
        disabled=disabled,
        covered_fullgraph=covered_fullgraph,
        kernel=inner,
    )
    try:
        _passes(run)
        if disabled is not None:  # what one step costs, run once more: compiled already
            _cost_one_step(run, disabled)
    except Exception as e:  # a compile failure is this check's finding, not a suite error
        failed, found = _failed(run, e)
        return evidence_of(failed, found=found, xformers_calls=run.xformers_calls[0])
    outcome, record = _judged(run)
    return evidence_of(outcome, found=record, xformers_calls=run.xformers_calls[0])


def _passes(run: _Run) -> None:
    """Run the compiled function on every shape twice: the first pass compiles (untimed for
    ``step_ms``), is compared against float64 and gathers a workaround's evidence; the
    second finds what compiles again on shapes already seen."""
    compiled, ctx = run.compiled, run.ctx
    prepare = outside_bias if run.variant == "mask-outside-compile" else None
    for pass_no in (1, 2):
        if pass_no == 2:
            run.first_pass = compiled.versions() - run.versions_before
            run.graphs = compiled.compilations[0] - run.compiles_before
        evidence = (
            watcher(compiled.disabled, run.workaround, run.xformers_calls, run.inner)
            if pass_no == 1
            else unwatched()
        )
        with evidence:
            for i, case in enumerate(run.cases):
                seeds = plan.COMPILE_SEEDS.at(i)
                inp = make_inputs(case, run.dtype, ctx.device, seed=seeds.inputs)
                grad = grad_out(case, ctx.device, seed=seeds.grad) if run.backward else None
                bias_grad = run.backward and wants_bias_grad(case)
                _sync(ctx)
                t0 = time.perf_counter()
                got = run_attention(
                    compiled.fn, run.mask_of, inp, grad, bias_grad=bias_grad, prepare=prepare
                )
                _sync(ctx)
                run.times.append(time.perf_counter() - t0)
                if pass_no == 1:
                    found, run.wrong = compare_attention(
                        got,
                        inp,
                        grad,
                        bias_grad=bias_grad,
                        dtype_name=str(run.dtype).removeprefix("torch."),
                        problems=run.problems,
                    )
                    run.comparisons += found


def _cost_one_step(run: _Run, disabled: Disabled) -> None:
    """One more step of the compiled layer (compiled already): the compiled regions it
    enters beyond the first are the graph breaks it crosses, per disabled call made."""
    seeds = plan.COMPILE_SEEDS
    case = run.cases[0]
    inp = make_inputs(case, run.dtype, run.ctx.device, seed=seeds.inputs)
    grad = grad_out(case, run.ctx.device, seed=seeds.grad) if run.backward else None
    calls_before = disabled.calls
    with count_compiled_regions() as regions:
        run_attention(
            run.compiled.fn,
            run.mask_of,
            inp,
            grad,
            bias_grad=run.backward and wants_bias_grad(case),
        )
    run.step_breaks, run.step_calls = regions[0] - 1, disabled.calls - calls_before


def _failed(run: _Run, error: Exception) -> tuple[Outcome, Found]:
    """The outcome of a check whose compiled function raised, and what it found so far."""
    compiled, numbers = run.compiled, run.numbers
    numbers["compilations"] = compiled.versions() - run.versions_before
    numbers |= _fault.error_fault(error)
    failed = Outcome.failed(f"compiled attention failed: {describe_error(error, 1200)}", numbers)
    new_breaks = graph_breaks() - run.breaks_before
    if run.attributing:
        failed = _attributed(run, failed)
    found = Found.of(
        new_breaks,
        compilations=0,
        graphs=compiled.compilations[0] - run.compiles_before,
        step_breaks=run.step_breaks,
        step_calls=run.step_calls,
    )
    return failed, found


def _judged(run: _Run) -> tuple[Outcome, Found]:
    """The outcome of a check that ran: its comparisons, graph breaks, versions compiled for
    its shapes and recompilations on shapes seen; and the record of what compiling found
    (kept by the first check of its dtype and grad mode)."""
    compiled, numbers, problems, cases = run.compiled, run.numbers, run.problems, run.cases
    again = compiled.versions() - run.versions_before - run.first_pass
    new_breaks = graph_breaks() - run.breaks_before
    mode = (run.dtype_name, run.backward)
    if mode not in compiled.found:  # this check compiled it: what it found is the record
        compiled.found[mode] = Found.of(
            new_breaks,
            compilations=run.first_pass,
            graphs=run.graphs,
            step_breaks=run.step_breaks,
            step_calls=run.step_calls,
        )
    record = compiled.found[mode]
    breaks, compilations, reasons = record.breaks, record.compilations, record.reasons
    allowed = 1 if run.dynamic else len(cases)
    numbers |= {
        "graph_breaks": breaks,
        "graph_break_reasons": reasons[:1500],
        "compilations": compilations,
        "compilations_allowed": allowed,
        "graphs_compiled": record.graphs,
        "recompilations_on_seen_shapes": again,
        "first_call_s": round(run.times[0], 3),
        "step_ms": round(statistics.median(run.times[len(cases) :]) * 1000, 3),
    }
    if breaks and run.variant != "dynamo-disable":
        problems.append(f"{breaks} graph break(s): {reasons[:400]}")
    if again or compilations > allowed:  # dynamo's own record of why
        reasons_now = guard_failures(compiled.code)[run.failures_before :]
        numbers["recompile_reasons"] = " || ".join(reasons_now)[-1500:]
    if again:
        problems.append(
            f"recompiled {again} time(s) on shapes already compiled (recompiles without end)"
        )
    if compilations > allowed:
        problems.append(
            f"compiled {compilations} versions for {len(cases)} shape(s)"
            f" ({'dynamic' if run.dynamic else 'static'}; at most {allowed} expected)"
        )
    outcome = tolerance.assess(run.comparisons, wrong=run.wrong, problems=problems, numbers=numbers)
    if outcome.status == "fail":
        subject = (
            f"{run.variant} compiled, {run.mask} mask, {'backward' if run.backward else 'forward'}"
        )
        outcome = replace(
            outcome, numbers=dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject)
        )
        if run.attributing:
            outcome = _attributed(run, outcome)
    return outcome, record


def _attributed(run: _Run, failed: Outcome) -> Outcome:
    """``failed`` with the experiments that decide who is at fault (`_compile_fault`); the
    bias object built outside is this check's case compiled with ``fullgraph=True``."""
    outside = partial(
        compile_check,
        run.ctx,
        "mask-outside-compile",
        run.mask,
        run.dynamic,
        True,
        run.dtype_name,
        run.backward,
        inner=run.inner,
    )
    return _compile_fault.attributed(
        run.ctx, failed, run.mask, run.dtype_name, run.backward, outside=outside
    )


def _refuse_what_eager_rejects(
    kernel: Impl, mask: MaskKind, case: Case, dtype: torch.dtype, ctx: Context
) -> None:
    """Skip when the implementation turns the inputs down eagerly (xformers and a
    ``[B,1,M,N]`` bias): attention.<impl>.bias_b1mn.safe records that; nothing to compile."""
    inp = make_inputs(case, dtype, ctx.device, seed=plan.COMPILE_SEEDS.inputs)
    try:
        run_attention(attention_fn(kernel, mask), kernel, inp, None)
    except (NotImplementedError, RuntimeError, ValueError) as e:
        raise Skip(
            f"{kernel} rejects a [B,1,M,N] bias as it is, eagerly (attention.{kernel}."
            f"bias_b1mn.safe records it): nothing to compile; {describe_error(e, 300)}"
        ) from e


#: --quick keeps, per implementation, compiled training with a dense tensor bias and
#: with a key-padding bias, and compiled inference with the causal mask (dynamic
#: shapes, fullgraph, bf16 on a GPU).
QUICK: frozenset[tuple[MaskKind, bool]] = frozenset(
    {("bias", True), ("padding", True), ("causal", False)}
)


def _dtypes(ctx: Context) -> tuple[str, ...]:
    return ("fp16", "bf16") if ctx.is_cuda else ("fp32",)


def _workarounds(
    ctx: Context, spec: CheckSpec, case: tuple[MaskKind, bool, bool, str, bool]
) -> tuple[CheckSpec, ...]:
    """The workaround checks of an xformers compile check, cheapest first: the bias object
    built outside (bias-object masks), the disabled call, SDPA in xformers' place."""
    mask = case[0]
    out: list[CheckSpec] = []
    if mask in BIAS_OBJECTS:
        out.append(
            spec.covered_by(
                "mask-outside-compile",
                partial(
                    compile_check,
                    ctx,
                    "mask-outside-compile",
                    *case,
                    workaround="mask-outside-compile",
                ),
                "xformers",
            )
        )
    out.append(
        spec.covered_by(
            "dynamo-disable",
            partial(compile_check, ctx, "dynamo-disable", *case, workaround="dynamo-disable"),
            "xformers",
        )
    )
    out.append(
        spec.covered_by(
            "sdpa-under-compile",
            partial(compile_check, ctx, "sdpa", *case, workaround="sdpa-under-compile"),
            "sdpa",
        )
    )
    return tuple(out)


def specs(ctx: Context) -> list[CheckSpec]:
    out: list[CheckSpec] = []
    impls: tuple[Impl, ...] = ("xformers", "sdpa")
    quick_dtype = "bf16" if ctx.is_cuda else "fp32"
    for impl in impls:
        for mask in MASKS:
            for dynamic in (False, True):
                for fullgraph in (True, False):
                    for dtype_name in _dtypes(ctx):
                        for backward in (False, True):
                            uses: tuple[Use, ...] = (
                                ("training-compiled",) if backward else ("inference-compiled",)
                            )
                            case = (mask, dynamic, fullgraph, dtype_name, backward)
                            spec = CheckSpec(
                                name=f"compile.{impl}.{mask}"
                                f".{'dynamic' if dynamic else 'static'}"
                                f".{'fullgraph' if fullgraph else 'nobreaks'}"
                                f".{dtype_name}.{'backward' if backward else 'forward'}",
                                gate=True,
                                uses=uses,
                                impl=impl,
                                run=partial(compile_check, ctx, impl, *case),
                                quick=dynamic
                                and fullgraph
                                and dtype_name == quick_dtype
                                and (mask, backward) in QUICK,
                            )
                            if impl == "xformers":
                                spec = replace(spec, workarounds=_workarounds(ctx, spec, case))
                            out.append(spec)
        dropout = CheckSpec(
            name=f"compile.{impl}.dropout",
            gate=True,
            uses=("training-compiled",),
            impl=impl,
            run=partial(_dropout.dropout_check, ctx, impl, compiled=True),
        )
        if impl == "xformers":
            dropout = replace(
                dropout,
                workarounds=(
                    dropout.covered_by(
                        "dynamo-disable",
                        partial(
                            _dropout.dropout_check,
                            ctx,
                            "xformers",
                            compiled=True,
                            workaround="dynamo-disable",
                        ),
                        "xformers",
                    ),
                    dropout.covered_by(
                        "sdpa-under-compile",
                        partial(
                            _dropout.dropout_check,
                            ctx,
                            "sdpa",
                            compiled=True,
                            workaround="sdpa-under-compile",
                        ),
                        "sdpa",
                    ),
                ),
            )
        out.append(dropout)
    out.append(
        CheckSpec(
            name="compile.xformers.opcheck",
            gate=False,
            impl="xformers",
            run=partial(opcheck_xformers, ctx),
        )
    )
    return out
