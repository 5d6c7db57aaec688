"""The evidence that a workaround compile check applied its workaround: what watches the
check's first pass, and its outcome settled by what was found
(`envbuilder.conformance._workaround` says what each workaround's evidence is)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from envbuilder.conformance._compiled_fn import Found
from envbuilder.conformance._record import Outcome, Workaround
from envbuilder.conformance._workaround import (
    Disabled,
    Kernel,
    count_kernel_calls,
    count_xformers_calls,
    with_evidence,
)

__all__ = ["settle", "unwatched", "watcher"]


def settle(
    outcome: Outcome,
    *,
    found: Found,
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


def watcher(
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
    return unwatched()


@contextlib.contextmanager
def _watching(disabled: Disabled) -> Iterator[list[int]]:
    with disabled.watch():
        yield [0]


@contextlib.contextmanager
def unwatched() -> Iterator[list[int]]:
    """Nothing watching: a direct check, or a pass after the one that gathers evidence."""
    yield [0]
