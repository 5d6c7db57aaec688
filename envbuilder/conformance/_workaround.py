"""Workarounds applied the way users apply them, and the evidence that they were.

``dynamo-disable``: the user's compiled code (a projection, the attention call,
another projection, as in a model) calls an attention function wrapped in
``torch.compiler.disable`` (``torch._dynamo.disable`` where torch has no
``torch.compiler.disable``). Dynamo breaks the graph at that call and runs the
function eagerly. Its evidence: dynamo's graph break (``graph_breaks`` >= 1)
and the attention kernel's operators dispatched from inside the disabled
function while it ran eagerly (``<kernel>_calls_outside_graph`` >= 1, counted
with a dispatch mode entered there, in the run that gathers evidence). Wrapping
the compiled callable itself in ``disable`` is *not* the workaround: torch
unwraps it (``innermost_fn``) and compiles the attention as if nothing was done.

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
    "count_xformers_calls",
    "disable",
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

        return disable(outside_graph)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        self.watching = True
        try:
            yield
        finally:
            self.watching = False

    def evidence(self, graph_breaks: int) -> tuple[bool, str, dict[str, Number]]:
        """Whether the disable was applied, what shows it, and the numbers to record."""
        numbers: dict[str, Number] = {
            "disabled_kernel": self.kernel,
            "disabled_calls_eager": self.calls,
            f"{self.kernel}_calls_outside_graph": self.ops,
        }
        missing = []
        if graph_breaks < 1:
            missing.append("dynamo broke no graph at the disabled call")
        if self.calls < 1:
            missing.append("the disabled attention function never ran outside compiled code")
        elif self.ops < 1:
            missing.append(f"no {self.kernel} operator ran from the disabled function")
        if missing:
            return False, "; ".join(missing), numbers
        return (
            True,
            f"{graph_breaks} graph break(s) at the disabled call; {self.ops} {self.kernel}"
            f" operator call(s) outside the compiled graph in the evidence step",
            numbers,
        )


@contextlib.contextmanager
def count_xformers_calls(into: list[int] | None = None) -> Iterator[list[int]]:
    """Count xformers' operators dispatched inside the block (compiled code included);
    the count is in the list's one item (``into``, or the yielded one) after the block,
    also when the block raised."""
    from torch.profiler import ProfilerActivity, profile

    found = into if into is not None else [0]
    prof = profile(activities=[ProfilerActivity.CPU])
    try:
        with prof:
            yield found
    finally:
        found[0] = sum(1 for event in prof.events() if _xformers_event(event))


def _xformers_event(event: Any) -> bool:
    if not is_xformers_op(event.name):
        return False
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:  # SDPA's own memory-efficient kernel calls the aten ops
        if is_sdpa_op(parent.name):
            return False
        parent = getattr(parent, "cpu_parent", None)
    return True


def replaced_evidence(xformers_calls: int) -> tuple[bool, str]:
    """Whether SDPA really took xformers' place, and what shows it."""
    if xformers_calls:
        return False, f"{xformers_calls} xformers operator call(s) in the evidence step"
    return True, "0 xformers operator calls in the evidence step (profiler)"


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
) -> Outcome:
    """*outcome* settled by the evidence that its workaround was applied (`settle`): the
    disabled call's graph break and eager xformers calls, or no xformers call at all."""
    if workaround is None:
        return outcome
    if disabled is not None:
        applied, evidence, numbers = disabled.evidence(graph_breaks)
        return settle(outcome, applied, evidence, numbers | {"graph_breaks": graph_breaks})
    applied, evidence = replaced_evidence(xformers_calls)
    return settle(outcome, applied, evidence, {"xformers_calls": xformers_calls})
