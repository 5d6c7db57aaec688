"""Workarounds applied the way users apply them, and the evidence that they were.

``dynamo-disable``: the user's compiled code (a projection, the attention call,
another projection, as in a model) calls an attention function wrapped in
``torch.compiler.disable`` (``torch._dynamo.disable`` where torch has no
``torch.compiler.disable``). Dynamo breaks the graph at that call and runs the
function eagerly. Its evidence: dynamo's graph break (``graph_breaks`` >= 1)
and the attention kernel's operators dispatched from inside the disabled
function while it ran eagerly (``<kernel>_calls_outside_graph`` >= 1, counted
with a dispatch mode entered there, in the run that gathers evidence); where the
check passes them, a break reason naming the disabled function (it is called
``disabled_<kernel>_attention``) and at least one compiled graph. Its cost is
recorded as ``graph_breaks_per_call`` and ``graph_breaks_per_step``, and
``drops_fullgraph`` says where the check it covers compiled with
``fullgraph=True`` (a disabled call is a graph break, which fullgraph refuses).
Wrapping the compiled callable itself in ``disable`` is *not* the workaround:
torch unwraps it (``innermost_fn``) and compiles the attention as if nothing was
done.

``mask-outside-compile``: xformers' bias object built outside the compiled
function and passed in, xformers still called inside it. Its evidence: no graph
break, at least one compiled graph, and xformers' operators run from inside a
compiled graph (``xformers_calls_in_graph`` >= 1, counted with the profiler,
whose events nest under the compiled region that called them).

A workaround that leaves the failure of the check it covers is no fix: one
covering a ``nobreaks`` check that still breaks the graph fails ("leaves the
check's own failure: N graph breaks").

``sdpa-under-compile`` / ``sdpa-instead``: SDPA in xformers' place. Evidence:
no xformers operator was dispatched in one step run under the profiler
(``xformers_calls`` == 0; the profiler sees the operators compiled code calls
too, where a dispatch mode would make dynamo run the code eagerly).

A workaround check without its evidence is ``invalid`` ("workaround not
applied: …"), never ``fail``: it says nothing about the workaround.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

import torch

from envbuilder.conformance._fault import normalise
from envbuilder.conformance._record import Number, Outcome

__all__ = [
    "Disabled",
    "Kernel",
    "count_compiled_regions",
    "count_kernel_calls",
    "count_xformers_calls",
    "disable",
    "inside_evidence",
    "is_sdpa_op",
    "is_xformers_op",
    "projected",
    "replaced_evidence",
    "settle",
    "watching",
    "with_evidence",
]

#: the kernel a disabled attention function runs (``sdpa`` makes the machinery testable
#: where xformers is absent).
Kernel: TypeAlias = Literal["xformers", "sdpa"]

#: ``aten`` operators that xformers' memory-efficient (cutlass) operator calls itself; SDPA
#: reaches them only from inside its own ``_scaled_dot_product_*`` operators.
_XFORMERS_ATEN = ("_efficient_attention_forward", "_efficient_attention_backward")


def _split(name: str) -> tuple[str, str]:
    """``(namespace, operator)`` of ``aten::mm``, ``aten.mm.default`` or ``aten.mm``."""
    if "::" in name:
        namespace, _, rest = name.partition("::")
    else:
        namespace, _, rest = name.partition(".")
    return namespace, rest.split(".", 1)[0]


def is_xformers_op(name: str) -> bool:
    """Whether an operator is one xformers' attention dispatches: its own namespaces, or
    the ``aten`` memory-efficient operators it calls directly."""
    namespace, op = _split(name)
    if namespace.startswith("xformers") or namespace == "flash_attn_3":
        return True
    return namespace == "aten" and op in _XFORMERS_ATEN


def is_sdpa_op(name: str) -> bool:
    """Whether an operator is SDPA's: a fused ``_scaled_dot_product_*`` one."""
    namespace, op = _split(name)
    return namespace == "aten" and op.startswith("_scaled_dot_product")


def _is_sdpa_dispatched(name: str) -> bool:
    """SDPA's operators as a dispatch mode sees them: the fused ones or, where SDPA takes
    its math path (decomposed before dispatch reaches the mode), the softmax it computes."""
    namespace, op = _split(name)
    return is_sdpa_op(name) or (namespace == "aten" and op in ("_safe_softmax", "_softmax"))


_COUNTED: dict[Kernel, Callable[[str], bool]] = {
    "xformers": is_xformers_op,
    "sdpa": _is_sdpa_dispatched,
}


def disable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind ``torch.compiler.disable`` (``torch._dynamo.disable`` on older torch)."""
    compiler = getattr(torch, "compiler", None)
    wrap = getattr(compiler, "disable", None) or torch._dynamo.disable
    wrapped: Callable[..., Any] = wrap(fn)
    return wrapped


def projected(attention: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A model's attention layer around ``attention``: input projections of q, k and v,
    the attention call, an output projection. Each projection is by the reversal
    permutation: exact in every dtype, and the scores are unchanged (q and k permuted
    alike), so the layer computes what ``attention`` computes."""

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: Any) -> torch.Tensor:
        perm = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device).flip(0)
        out = attention(q @ perm, k @ perm, v @ perm, m)
        return out @ perm

    return layer


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    probe = getattr(compiler, "is_compiling", None) or torch._dynamo.is_compiling
    return bool(probe())


@dataclass
class Disabled:
    """An attention function behind ``disable``, counting its eager calls and (while
    ``watching``) the operators of its kernel that those calls dispatched.

    A call made while dynamo traces (the disable did not hold) counts nothing: the
    counters move only when the function really runs outside compiled code.
    """

    kernel: Kernel
    calls: int = 0
    ops: int = 0
    watching: bool = False

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        from torch.utils._python_dispatch import TorchDispatchMode

        counted = _COUNTED[self.kernel]
        tracker = self

        class Count(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                if counted(str(func)):
                    tracker.ops += 1
                return func(*args, **(kwargs or {}))

        def outside_graph(*args: Any, **kwargs: Any) -> Any:
            if _compiling():
                return fn(*args, **kwargs)
            tracker.calls += 1
            if not tracker.watching:
                return fn(*args, **kwargs)
            with Count():
                return fn(*args, **kwargs)

        # dynamo's break reason names the function: the evidence looks for this name
        outside_graph.__name__ = outside_graph.__qualname__ = self.name
        return disable(outside_graph)

    @property
    def name(self) -> str:
        """The disabled function's name, as dynamo's graph break reason quotes it."""
        return f"disabled_{self.kernel}_attention"

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        self.watching = True
        try:
            yield
        finally:
            self.watching = False

    def evidence(
        self,
        graph_breaks: int,
        *,
        break_reasons: str | None = None,
        graphs_compiled: int | None = None,
        drops_fullgraph: bool | None = None,
        graph_breaks_per_call: float | None = None,
        graph_breaks_per_step: float | None = None,
    ) -> tuple[bool, str, dict[str, Number]]:
        """Whether the disable was applied, what shows it, and the numbers to record.

        ``break_reasons`` (dynamo's reasons for the breaks) must name the disabled function
        and ``graphs_compiled`` be at least one, where the check passes them; the cost
        (breaks per call and per step, ``drops_fullgraph``) is recorded as given."""
        numbers: dict[str, Number] = {
            "disabled_kernel": self.kernel,
            "disabled_calls_eager": self.calls,
            f"{self.kernel}_calls_outside_graph": self.ops,
        }
        cost: dict[str, Number | None] = {
            "drops_fullgraph": drops_fullgraph,
            "graph_breaks_per_call": graph_breaks_per_call,
            "graph_breaks_per_step": graph_breaks_per_step,
            "graphs_compiled": graphs_compiled,
        }
        numbers |= {key: value for key, value in cost.items() if value is not None}
        missing = []
        if graph_breaks < 1:
            missing.append("dynamo broke no graph at the disabled call")
        elif break_reasons is not None and self.name not in break_reasons:
            missing.append(f"no graph break reason names the disabled function {self.name}")
        if graphs_compiled is not None and graphs_compiled < 1:
            missing.append("no graph was compiled around the disabled call")
        if self.calls < 1:
            missing.append("the disabled attention function never ran outside compiled code")
        elif self.ops < 1:
            missing.append(f"no {self.kernel} operator ran from the disabled function")
        if missing:
            return False, "; ".join(missing), numbers
        said = [f"{graph_breaks} graph break(s) at the disabled call"]
        if break_reasons is not None:
            said = [f"dynamo recorded {graph_breaks} graph break(s), a reason naming {self.name}"]
        if graphs_compiled is not None:
            said.append(f"{graphs_compiled} graph(s) compiled")
        said.append(
            f"{self.ops} {self.kernel} operator call(s) outside the compiled graph in the"
            " evidence step"
        )
        if graph_breaks_per_call is not None and graph_breaks_per_step is not None:
            said.append(
                f"costs {graph_breaks_per_call:g} graph break(s) per call,"
                f" {graph_breaks_per_step:g} per step"
            )
        if drops_fullgraph:
            said.append("drops fullgraph=True (a disabled call is a graph break)")
        return True, "; ".join(said), numbers


@contextlib.contextmanager
def count_xformers_calls(into: list[int] | None = None) -> Iterator[list[int]]:
    """Count xformers' operators dispatched inside the block (compiled code included);
    the count is in the list's one item (``into``, or the yielded one) after the block,
    also when the block raised."""
    with count_kernel_calls("xformers", into) as found:
        yield found


@contextlib.contextmanager
def count_kernel_calls(
    kernel: Kernel, into: list[int] | None = None, *, in_graph: bool = False
) -> Iterator[list[int]]:
    """Count ``kernel``'s operators run inside the block (the profiler sees compiled code
    too); with ``in_graph`` only those run from inside a compiled graph. The count is in
    the list's one item (``into``, or the yielded one) after the block, also when the
    block raised."""
    from torch.profiler import ProfilerActivity, profile

    counted = _xformers_event if kernel == "xformers" else _sdpa_event
    found = into if into is not None else [0]
    prof = profile(activities=[ProfilerActivity.CPU])
    try:
        with prof:
            yield found
    finally:
        found[0] = sum(
            1
            for event in prof.events()
            if counted(event) and (not in_graph or _in_compiled_graph(event))
        )


@contextlib.contextmanager
def count_compiled_regions(into: list[int] | None = None) -> Iterator[list[int]]:
    """Count the compiled frames entered inside the block (the profiler's "Torch-Compiled
    Region" ranges): a function compiled whole enters one per call, and each graph break
    crossed at run time one more (the code after it runs as a frame of its own). The count
    is in the list's one item (``into``, or the yielded one) after the block."""
    from torch.profiler import ProfilerActivity, profile

    found = into if into is not None else [0]
    prof = profile(activities=[ProfilerActivity.CPU])
    try:
        with prof:
            yield found
    finally:
        found[0] = sum(
            1 for event in prof.events() if str(event.name).startswith("Torch-Compiled Region")
        )


def _ancestors(event: Any) -> Iterator[Any]:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        yield parent
        parent = getattr(parent, "cpu_parent", None)


#: the profiler's names of the ranges compiled code runs in (a compiled graph's call, its
#: autograd function forward and backward, the compiled frame)
_COMPILED_RANGES = ("## Call CompiledFxGraph", "CompiledFunction", "Torch-Compiled Region")


def _in_compiled_graph(event: Any) -> bool:
    return any(
        str(parent.name).startswith(_COMPILED_RANGES)
        or "CompiledFunctionBackward" in str(parent.name)
        for parent in _ancestors(event)
    )


def _sdpa_event(event: Any) -> bool:
    return is_sdpa_op(event.name)


def _xformers_event(event: Any) -> bool:
    # SDPA's own memory-efficient kernel calls the aten ops
    return is_xformers_op(event.name) and not any(is_sdpa_op(p.name) for p in _ancestors(event))


def replaced_evidence(xformers_calls: int) -> tuple[bool, str]:
    """Whether SDPA really took xformers' place, and what shows it."""
    if xformers_calls:
        return False, f"{xformers_calls} xformers operator call(s) in the evidence step"
    return True, "0 xformers operator calls in the evidence step (profiler)"


def inside_evidence(
    graph_breaks: int, graphs_compiled: int, kernel_calls_in_graph: int, kernel: Kernel
) -> tuple[bool, str]:
    """Whether the kernel ran inside compiled code with its mask built outside, and what
    shows it (``mask-outside-compile``); a graph break is the check's, not missing evidence."""
    missing = []
    if graphs_compiled < 1:
        missing.append("no graph was compiled")
    if kernel_calls_in_graph < 1:
        missing.append(f"no {kernel} operator ran inside a compiled graph")
    if missing:
        return False, "; ".join(missing)
    return True, (
        f"{graphs_compiled} graph(s) compiled, {graph_breaks} graph break(s);"
        f" {kernel_calls_in_graph} {kernel} operator call(s) inside the compiled graph"
        " in the evidence step (profiler)"
    )


def settle(outcome: Outcome, applied: bool, evidence: str, numbers: dict[str, Number]) -> Outcome:
    """A workaround check's outcome with its evidence recorded: ``invalid`` without it."""
    recorded = dict(outcome.numbers) | numbers | {"applied": applied, "applied_evidence": evidence}
    if not applied:
        found = f" (the run found: {outcome.reason})" if outcome.reason else ""
        recorded["cause"] = f"workaround not applied: {normalise(evidence)}"[:160]
        return Outcome.invalid(f"workaround not applied: {evidence}{found}", recorded)
    return replace(outcome, numbers=recorded)


def watching(
    disabled: Disabled | None, workaround: str | None, into: list[int], *, first: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """What watches a workaround check's first (evidence) step: the disabled function's own
    counters (``dynamo-disable``), or the profiler counting xformers' operators into *into*
    (the SDPA workarounds); nothing for a direct check or a later step."""
    if not first or workaround is None:
        return contextlib.nullcontext()
    if disabled is not None:
        return disabled.watch()
    return count_xformers_calls(into)


def with_evidence(
    outcome: Outcome,
    workaround: str | None,
    disabled: Disabled | None,
    graph_breaks: int,
    xformers_calls: int,
    *,
    break_reasons: str | None = None,
    graphs_compiled: int | None = None,
    drops_fullgraph: bool | None = None,
    graph_breaks_per_call: float | None = None,
    graph_breaks_per_step: float | None = None,
    covers_nobreaks: bool = False,
    kernel: Kernel = "xformers",
) -> Outcome:
    """*outcome* settled by the evidence that its workaround was applied (`settle`): the
    disabled call's graph break and eager kernel calls (`Disabled.evidence`, which the
    keyword arguments feed), the kernel called inside compiled code with no break
    (``mask-outside-compile``; ``xformers_calls`` then counts ``kernel``'s calls inside
    the graph), or no xformers call at all (the SDPA ones).

    ``covers_nobreaks``: the covered check fails on any graph break, so a workaround
    that still breaks the graph fails too ("leaves the check's own failure")."""
    if workaround is None:
        return outcome
    if disabled is not None:
        applied, evidence, numbers = disabled.evidence(
            graph_breaks,
            break_reasons=break_reasons,
            graphs_compiled=graphs_compiled,
            drops_fullgraph=drops_fullgraph,
            graph_breaks_per_call=graph_breaks_per_call,
            graph_breaks_per_step=graph_breaks_per_step,
        )
        numbers["graph_breaks"] = graph_breaks
    elif workaround == "mask-outside-compile":
        applied, evidence = inside_evidence(
            graph_breaks, graphs_compiled or 0, xformers_calls, kernel
        )
        numbers = {"graph_breaks": graph_breaks, f"{kernel}_calls_in_graph": xformers_calls}
    else:
        applied, evidence = replaced_evidence(xformers_calls)
        numbers = {"xformers_calls": xformers_calls}
    settled = settle(outcome, applied, evidence, numbers)
    if applied and covers_nobreaks and graph_breaks > 0:
        return _leaves_failure(settled, graph_breaks)
    return settled


def _leaves_failure(outcome: Outcome, graph_breaks: int) -> Outcome:
    """A workaround check whose covered check forbids graph breaks, still breaking: failed."""
    reason = f"leaves the check's own failure: {graph_breaks} graph break(s)"
    if outcome.reason:
        reason += f"; {outcome.reason}"
    cause = "workaround leaves the check's own failure: graph breaks"
    return Outcome.failed(reason, dict(outcome.numbers) | {"cause": cause})
