"""One ``torch.compile`` of an attention function, shared by the compile checks of its key,
and what dynamo records while it runs: graph breaks and their reasons, why it compiled
again, the versions it keeps (`envbuilder.conformance.checks_compile`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from envbuilder.conformance import plan
from envbuilder.conformance._attn import Case, MaskKind
from envbuilder.conformance._context import Context
from envbuilder.conformance._workaround import Disabled

__all__ = [
    "Compiled",
    "Found",
    "break_reasons",
    "counting_backend",
    "graph_breaks",
    "guard_failures",
    "raise_compile_limits",
    "shapes",
]

#: dynamo keeps at most a few compiled versions of one function by default and
#: then runs it eagerly without a word; these checks compile one function for
#: many mask kinds, dtypes and grad modes, so the limits are raised.
_COMPILE_LIMITS = {
    "cache_size_limit": 4096,
    "recompile_limit": 4096,
    "accumulated_cache_size_limit": 65536,
    "accumulated_recompile_limit": 65536,
}


def raise_compile_limits() -> None:
    for name, value in _COMPILE_LIMITS.items():
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)


@dataclass(frozen=True)
class Found:
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

    @classmethod
    def of(
        cls,
        new_breaks: Counter[str],
        *,
        compilations: int,
        graphs: int,
        step_breaks: int,
        step_calls: int,
    ) -> Found:
        """What a run found, from the graph breaks dynamo counted while it ran."""
        return cls(
            breaks=sum(new_breaks.values()),
            compilations=compilations,
            graphs=graphs,
            reasons=break_reasons(new_breaks),
            reasons_full=break_reasons(new_breaks, whole=True),
            step_breaks=step_breaks,
            step_calls=step_calls,
        )


@dataclass
class Compiled:
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
    found: dict[tuple[str, bool], Found] = field(default_factory=dict)
    #: the disabled attention function a ``dynamo-disable`` layer calls
    disabled: Disabled | None = None

    def versions(self) -> int:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(self.code))


def counting_backend(counter: list[int]) -> Callable[..., Any]:
    """Inductor, counting in ``counter`` the graphs it is given to compile."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        counter[0] += 1
        return compile_fx(gm, example_inputs)

    return backend


def shapes(ctx: Context, mask: MaskKind, dynamic: bool) -> list[Case]:
    """The problems a compiled function runs: one shape when static, two when dynamic
    (`plan.compile_cases`)."""
    cases = plan.compile_cases(cuda=ctx.is_cuda)
    return [c.with_mask(mask) for c in cases[: 2 if dynamic else 1]]


def graph_breaks() -> Counter[str]:
    """Dynamo's graph breaks so far, by reason."""
    from torch._dynamo.utils import counters

    return Counter({str(k): int(v) for k, v in counters["graph_break"].items()})


def guard_failures(code: Any) -> list[str]:
    """Why dynamo compiled ``code`` again so far (its own record; empty where this torch
    keeps none). Closures of one factory share the code: every mask kind's entries fail."""
    from torch._dynamo import utils

    record = getattr(utils, "guard_failures", {})
    return [str(reason).splitlines()[0] for reason in record.get(code, [])]


def break_reasons(breaks: Counter[str], *, whole: bool = False) -> str:
    """Dynamo's graph break reasons with their counts: each one's first line (as results
    record them), or ``whole``, where dynamo names the function it skipped."""
    return " || ".join(
        f"{n} x {' '.join(r.split()) if whole else r.splitlines()[0]}" for r, n in breaks.items()
    )
