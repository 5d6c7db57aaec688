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
(`envbuilder.conformance._glue`): for a bias object, the same attention with the
object built outside and ``fullgraph=True``; for FakeTensor device propagation in
an ``aten`` operator, that operator alone with the arguments xformers passed it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import torch

from envbuilder.conformance import _dropout, _fault, _glue, plan, tolerance
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
    Kernel,
    count_compiled_regions,
    count_kernel_calls,
    count_xformers_calls,
    projected,
    with_evidence,
)
from envbuilder.conformance.checks_attention import compare_attention, grad_out

__all__ = ["compile_check", "specs"]

#: the attention code that is compiled: an implementation, an attention layer calling
#: xformers behind ``torch.compiler.disable`` (the ``dynamo-disable`` workaround), or
#: xformers called with a bias object built outside and passed in (``mask-outside-compile``).
Variant = Literal["xformers", "sdpa", "dynamo-disable", "mask-outside-compile"]

#: the xformers class a bias-object mask kind builds
_BIAS_CLASS: dict[MaskKind, str] = {
    "causal": "LowerTriangularMask",
    "blockdiag": "BlockDiagonalMask",
}

#: dynamo keeps at most a few compiled versions of one function by default and
#: then runs it eagerly without a word; these checks compile one function for
#: many mask kinds, dtypes and grad modes, so the limits are raised.
_COMPILE_LIMITS = {
    "cache_size_limit": 4096,
    "recompile_limit": 4096,
    "accumulated_cache_size_limit": 65536,
    "accumulated_recompile_limit": 65536,
}


def _raise_compile_limits() -> None:
    for name, value in _COMPILE_LIMITS.items():
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)


@dataclass(frozen=True)
class _Found:
    """What compiling one function for one (dtype, grad mode) found: dynamo's graph breaks
    (its count while compiling, which counts a break again when dynamo restarts its trace)
    and their reasons, the compiled versions and graphs, and the breaks crossed and the
    attention calls made in one step run once compiled (the cost per step)."""

    breaks: int
    compilations: int
    graphs: int
    reasons: str
    #: the reasons whole, which the disable's evidence searches for the function's name
    reasons_full: str
    step_breaks: int
    step_calls: int


@dataclass
class _Compiled:
    """One ``torch.compile`` of one attention function, shared by the checks of its key;
    what compiling it for a (dtype, grad mode) found is kept for every later check.

    ``compilations`` counts every graph the backend compiled while this function ran,
    the frames of code it calls included (xformers' dispatch code is compiled apart,
    at run time); ``versions()`` counts the compiled versions of the function itself,
    which is what the shapes must explain.
    """

    fn: Callable[..., torch.Tensor]
    code: Any
    compilations: list[int]
    found: dict[tuple[str, bool], _Found] = field(default_factory=dict)
    #: the disabled attention function a ``dynamo-disable`` layer calls
    disabled: Disabled | None = None

    def versions(self) -> int:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(self.code))


def _counting_backend(counter: list[int]) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        counter[0] += 1
        return compile_fx(gm, example_inputs)

    return backend


def _compiled(
    ctx: Context,
    variant: Variant,
    mask: MaskKind,
    dynamic: bool,
    fullgraph: bool,
    inner: Kernel = "xformers",
) -> _Compiled:
    key = f"compiled/{variant}/{inner}/{mask}/{dynamic}/{fullgraph}"
    if key not in ctx.cache:
        _raise_compile_limits()
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
            attention, backend=_counting_backend(counter), dynamic=dynamic, fullgraph=fullgraph
        )
        # closures of one factory share their code object: versions are counted as deltas
        ctx.cache[key] = _Compiled(
            fn=fn, code=attention.__code__, compilations=counter, disabled=disabled
        )
    compiled: _Compiled = ctx.cache[key]
    return compiled


def _bias_passed_in(call: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """xformers' attention taking a bias object its caller built outside compiled code."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any) -> torch.Tensor:
        return call(q, k, v, bias)

    return attention


def shapes(ctx: Context, mask: MaskKind, dynamic: bool) -> list[Case]:
    """The problems a compiled function runs: one shape when static, two when dynamic
    (`plan.compile_cases`)."""
    cases = plan.compile_cases(cuda=ctx.is_cuda)
    return [c.with_mask(mask) for c in cases[: 2 if dynamic else 1]]


def _graph_breaks() -> Counter[str]:
    from torch._dynamo.utils import counters

    return Counter({str(k): int(v) for k, v in counters["graph_break"].items()})


def _guard_failures(code: Any) -> list[str]:
    """Why dynamo compiled ``code`` again so far (its own record; empty where this torch
    keeps none). Closures of one factory share the code: every mask kind's entries fail."""
    from torch._dynamo import utils

    record = getattr(utils, "guard_failures", {})
    return [str(reason).splitlines()[0] for reason in record.get(code, [])]


def _sync(ctx: Context) -> None:
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)


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
    dtype = DTYPES[dtype_name]
    kernel: Impl = "sdpa" if variant == "sdpa" or inner == "sdpa" else "xformers"
    # the mask argument: SDPA's own, else xformers' (a bias object passed in, or the input
    # the bias is built from)
    mask_of: Impl = "sdpa" if variant == "sdpa" else "xformers"
    prepare = outside_bias if variant == "mask-outside-compile" else None
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
    subject = f"{variant} compiled, {mask} mask, {'backward' if backward else 'forward'}"
    problems: list[str] = []
    comparisons: list[tolerance.Comparison] = []
    wrong = ""
    if mask == "bias_b1mn" and kernel == "xformers":
        _refuse_what_eager_rejects(kernel, mask, cases[0], dtype, ctx)
    breaks_before = _graph_breaks()
    failures_before = len(_guard_failures(compiled.code))
    compiles_before = compiled.compilations[0]
    versions_before = compiled.versions()
    disabled = compiled.disabled
    if disabled is not None:
        disabled.calls = disabled.ops = 0
    xformers_calls = [0]
    times: list[float] = []
    step_breaks = step_calls = 0
    evidence_of = partial(
        _settle,
        workaround=workaround,
        disabled=disabled,
        covered_fullgraph=covered_fullgraph,
        kernel=inner,
    )
    try:
        for pass_no in (1, 2):
            if pass_no == 2:
                first_pass = compiled.versions() - versions_before
                graphs = compiled.compilations[0] - compiles_before
            # the first pass (it compiles; untimed for step_ms) gathers the evidence
            evidence = (
                _evidence(disabled, workaround, xformers_calls, inner)
                if pass_no == 1
                else _no_evidence()
            )
            with evidence:
                for i, case in enumerate(cases):
                    seeds = plan.COMPILE_SEEDS.at(i)
                    inp = make_inputs(case, dtype, ctx.device, seed=seeds.inputs)
                    grad = grad_out(case, ctx.device, seed=seeds.grad) if backward else None
                    bias_grad = backward and wants_bias_grad(case)
                    _sync(ctx)
                    t0 = time.perf_counter()
                    got = run_attention(
                        compiled.fn, mask_of, inp, grad, bias_grad=bias_grad, prepare=prepare
                    )
                    _sync(ctx)
                    times.append(time.perf_counter() - t0)
                    if pass_no == 1:
                        found, wrong = compare_attention(
                            got,
                            inp,
                            grad,
                            bias_grad=bias_grad,
                            dtype_name=str(dtype).removeprefix("torch."),
                            problems=problems,
                        )
                        comparisons += found
        if disabled is not None:  # what one step costs, run once more: compiled already
            seeds = plan.COMPILE_SEEDS
            inp = make_inputs(cases[0], dtype, ctx.device, seed=seeds.inputs)
            grad = grad_out(cases[0], ctx.device, seed=seeds.grad) if backward else None
            calls_before = disabled.calls
            with count_compiled_regions() as regions:
                run_attention(
                    compiled.fn,
                    mask_of,
                    inp,
                    grad,
                    bias_grad=backward and wants_bias_grad(cases[0]),
                )
            step_breaks, step_calls = regions[0] - 1, disabled.calls - calls_before
    except Exception as e:  # a compile failure is this check's finding, not a suite error
        numbers["compilations"] = compiled.versions() - versions_before
        numbers |= _fault.error_fault(e)
        failed = Outcome.failed(f"compiled attention failed: {describe_error(e, 1200)}", numbers)
        new_breaks = _graph_breaks() - breaks_before
        if variant == "xformers" and workaround is None:
            failed = _attributed(ctx, failed, mask, dynamic, dtype_name, backward, inner)
        return evidence_of(
            failed,
            found=_Found(
                breaks=sum(new_breaks.values()),
                compilations=0,
                graphs=compiled.compilations[0] - compiles_before,
                reasons=_reasons(new_breaks),
                reasons_full=_reasons(new_breaks, whole=True),
                step_breaks=step_breaks,
                step_calls=step_calls,
            ),
            xformers_calls=xformers_calls[0],
        )
    again = compiled.versions() - versions_before - first_pass
    new_breaks = _graph_breaks() - breaks_before
    mode = (dtype_name, backward)
    if mode not in compiled.found:  # this check compiled it: what it found is the record
        compiled.found[mode] = _Found(
            breaks=sum(new_breaks.values()),
            compilations=first_pass,
            graphs=graphs,
            reasons=_reasons(new_breaks),
            reasons_full=_reasons(new_breaks, whole=True),
            step_breaks=step_breaks,
            step_calls=step_calls,
        )
    record = compiled.found[mode]
    breaks, compilations, reasons = record.breaks, record.compilations, record.reasons
    allowed = 1 if dynamic else len(cases)
    numbers |= {
        "graph_breaks": breaks,
        "graph_break_reasons": reasons[:1500],
        "compilations": compilations,
        "compilations_allowed": allowed,
        "graphs_compiled": record.graphs,
        "recompilations_on_seen_shapes": again,
        "first_call_s": round(times[0], 3),
        "step_ms": round(statistics.median(times[len(cases) :]) * 1000, 3),
    }
    if breaks and variant != "dynamo-disable":
        problems.append(f"{breaks} graph break(s): {reasons[:400]}")
    if again or compilations > allowed:  # dynamo's own record of why
        reasons_now = _guard_failures(compiled.code)[failures_before:]
        numbers["recompile_reasons"] = " || ".join(reasons_now)[-1500:]
    if again:
        problems.append(
            f"recompiled {again} time(s) on shapes already compiled (recompiles without end)"
        )
    if compilations > allowed:
        problems.append(
            f"compiled {compilations} versions for {len(cases)} shape(s)"
            f" ({'dynamic' if dynamic else 'static'}; at most {allowed} expected)"
        )
    outcome = tolerance.assess(comparisons, wrong=wrong, problems=problems, numbers=numbers)
    if outcome.status == "fail":
        outcome = replace(
            outcome, numbers=dict(outcome.numbers) | _fault.problem_fault(outcome.reason, subject)
        )
        if variant == "xformers" and workaround is None:
            outcome = _attributed(ctx, outcome, mask, dynamic, dtype_name, backward, inner)
    return evidence_of(outcome, found=record, xformers_calls=xformers_calls[0])


def _reasons(breaks: Counter[str], *, whole: bool = False) -> str:
    """Dynamo's graph break reasons with their counts: each one's first line (as results
    record them), or ``whole``, where dynamo names the function it skipped."""
    return " || ".join(
        f"{n} x {' '.join(r.split()) if whole else r.splitlines()[0]}" for r, n in breaks.items()
    )


def _settle(
    outcome: Outcome,
    *,
    found: _Found,
    xformers_calls: int,
    workaround: Workaround | None,
    disabled: Disabled | None,
    covered_fullgraph: bool,
    kernel: Kernel,
) -> Outcome:
    """A workaround check's outcome settled by its evidence (`with_evidence`): for the
    disable, its cost per call and per step and whether it drops ``fullgraph=True``."""
    per_call: float | None = None
    if disabled is not None and found.step_calls:
        per_call = round(found.step_breaks / found.step_calls, 3)
    return with_evidence(
        outcome,
        workaround,
        disabled,
        found.breaks,
        xformers_calls,
        break_reasons=found.reasons_full if disabled is not None else None,
        graphs_compiled=found.graphs,
        drops_fullgraph=covered_fullgraph if disabled is not None else None,
        graph_breaks_per_call=per_call,
        graph_breaks_per_step=found.step_breaks if disabled is not None else None,
        covers_nobreaks=not covered_fullgraph,
        kernel=kernel,
    )


def _attributed(
    ctx: Context,
    failed: Outcome,
    mask: MaskKind,
    dynamic: bool,
    dtype_name: str,
    backward: bool,
    inner: Kernel,
) -> Outcome:
    """``failed`` (a direct xformers check) with the experiments that apply to its cause
    run and recorded (`_experiments`), their verdict on who is at fault included."""
    if failed.numbers.get("fault_component") == "suite":
        return failed
    found = _experiments(ctx, failed, mask, dynamic, dtype_name, backward, inner)
    return replace(failed, numbers=dict(failed.numbers) | found)


def _experiments(
    ctx: Context,
    failed: Outcome,
    mask: MaskKind,
    dynamic: bool,
    dtype_name: str,
    backward: bool,
    inner: Kernel,
) -> dict[str, Number]:
    """The experiments for a failing xformers check: a bias object built outside
    (`_glue.decide_mask_outside`), then, for FakeTensor device propagation in an ``aten``
    operator (the direct check's or the outside run's), the glue isolation. The first to
    decide is the verdict; with none, ``undecided`` says what ran."""
    out: dict[str, Number] = {}
    ran: list[str] = []
    cause = str(failed.numbers.get("cause", ""))
    op = failed.numbers.get("fault_op")
    if mask in BIAS_OBJECTS:
        outside = compile_check(
            ctx, "mask-outside-compile", mask, dynamic, True, dtype_name, backward, inner=inner
        )
        said = "pass" if outside.status == "pass" else f"{outside.status}: {outside.reason[:300]}"
        out["cf_mask_outside_fullgraph"] = said
        verdict = _glue.decide_mask_outside(said, cause, _BIAS_CLASS[mask])
        if verdict["fault_component"] != "undecided":
            return out | verdict
        ran.append(str(verdict["fault_evidence"]))
        if str(outside.numbers.get("cause", "")).startswith("FakeTensor device propagation"):
            cause, op = str(outside.numbers["cause"]), outside.numbers.get("fault_op")
    if cause.startswith("FakeTensor device propagation") and str(op).startswith("aten."):
        runs = _glue_isolation(ctx, mask, dtype_name, backward, str(op))
        out |= runs
        if runs.get("fault_component") not in (None, "undecided"):
            return out
        ran.append(str(runs.get("fault_evidence") or runs.get("cf_glue")))
    evidence = "; ".join(ran) if ran else f"no experiment decides this cause ({cause})"
    return out | {"fault_component": "undecided", "fault_evidence": evidence[:400]}


def _glue_isolation(
    ctx: Context, mask: MaskKind, dtype_name: str, backward: bool, op: str
) -> dict[str, Number]:
    """`_glue.isolate_glue` on the arguments xformers passes ``op`` on this check's case,
    captured in an eager run (xformers' kernels need a CUDA device)."""
    if not ctx.is_cuda:
        return {"cf_glue": "could not run here: xformers' kernels need a CUDA device"}
    case = shapes(ctx, mask, False)[0]
    inp = make_inputs(case, DTYPES[dtype_name], ctx.device, seed=plan.COMPILE_SEEDS.inputs)
    grad = grad_out(case, ctx.device, seed=plan.COMPILE_SEEDS.grad) if backward else None
    bias_grad = backward and wants_bias_grad(case)

    def eager() -> None:
        run_attention(attention_fn("xformers", mask), "xformers", inp, grad, bias_grad=bias_grad)

    try:
        captured = _glue.capture_op_args(eager, op)
    except Exception as e:  # xformers failing eagerly is a finding of its own, recorded
        return {"cf_glue": f"fail: the eager run failed: {describe_error(e, 300)}"}
    if captured is None:
        return {"cf_glue": f"the eager run called no {op}"}
    return _glue.isolate_glue(captured)


def _evidence(
    disabled: Disabled | None,
    workaround: Workaround | None,
    xformers_calls: list[int],
    inner: Kernel,
) -> contextlib.AbstractContextManager[list[int]]:
    """What watches a workaround check's first pass: the disabled function's own counters
    (``dynamo-disable``), the profiler counting the kernel's operators inside compiled
    graphs (``mask-outside-compile``) or xformers' operators anywhere (the SDPA ones)."""
    if disabled is not None:
        return _watching(disabled)
    if workaround == "mask-outside-compile":
        return count_kernel_calls(inner, xformers_calls, in_graph=True)
    if workaround is not None:
        return count_xformers_calls(xformers_calls)
    return _no_evidence()


@contextlib.contextmanager
def _watching(disabled: Disabled) -> Iterator[list[int]]:
    with disabled.watch():
        yield [0]


@contextlib.contextmanager
def _no_evidence() -> Iterator[list[int]]:
    yield [0]


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


def opcheck_xformers(ctx: Context) -> Outcome:
    """``torch.library.opcheck`` on every xformers operator that attention actually calls."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    seen: dict[Any, tuple[Any, Any]] = {}

    def snapshot(value: Any) -> Any:
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            namespace = getattr(func, "namespace", "")
            if (
                namespace.startswith("xformers") or namespace == "flash_attn_3"
            ) and func not in seen:
                seen[func] = (tree_map(snapshot, args), tree_map(snapshot, kwargs or {}))
            return func(*args, **(kwargs or {}))

    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    for mask in ("none", "causal"):
        q, k, v = (
            torch.randn(2, 64, 4, 64, device=ctx.device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        try:
            with Recorder():
                attention_fn("xformers", mask)(q, k, v, None).sum().backward()
        except NotImplementedError as e:
            return Outcome.failed(f"attention itself fails: {describe_error(e, 1200)}", {})
    if not seen:
        return Outcome.passed(
            {"ops": "", "note": "attention called no xformers-registered operator"}
        )
    numbers: dict[str, Number] = {"ops": " ".join(sorted(str(f) for f in seen))}
    problems: list[str] = []
    for func, (args, kwargs) in seen.items():
        try:
            torch.library.opcheck(func, args, kwargs)
            numbers[str(func)] = "ok"
        except Exception as e:  # opcheck raises OpCheckError naming the failing test
            numbers[str(func)] = describe_error(e, 1200)
            problems.append(f"{func}: {describe_error(e, 300)}")
    return Outcome.judge(problems, numbers)


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
