"""The failure causes ``envbuilder repro`` has a minimal script for, and which checks they cover.

A cause is a bug as one upstream project would see it, not a check: the diffusers
mask conversion fails eight checks of two groups, one script shows it. A failed
check belongs to a cause when its name is of the cause's family and its recorded
``cause`` (or reason) says the cause's failure; `cause_of` finds it. Checks that
share a cause in one run share its script (`scripts.render`).

Adding a cause is one `KnownCause` in `KNOWN` and its script body in `scripts`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from envbuilder.repro.records import Recorded, RecordedRun

__all__ = [
    "KNOWN",
    "PROJECTS",
    "CauseKey",
    "KnownCause",
    "Project",
    "by_key",
    "cause_of",
    "listed",
    "sharing",
]

CauseKey: TypeAlias = Literal[
    "diffusers-xformers-bool-mask", "xformers-compiled-bias-backward", "xformers-causal-fullgraph"
]
Project: TypeAlias = Literal["torch", "xformers", "diffusers"]
#: where each project takes its issues
PROJECTS: Mapping[Project, str] = {
    "torch": "pytorch/pytorch",
    "xformers": "facebookresearch/xformers",
    "diffusers": "huggingface/diffusers",
}


@dataclass(frozen=True, kw_only=True)
class KnownCause:
    """One bug with a minimal script: the checks it fails and how to say it upstream."""

    key: CauseKey
    #: check-name globs of the checks this cause can fail
    names: tuple[str, ...]
    #: what a failed check's ``cause`` (else its reason) says when this is its cause
    failure: re.Pattern[str]
    title: str  # the title
    summary: str  # one line in the terms of the API the script calls
    expected: str  # what the script expects instead of the failure
    needs: tuple[str, ...]  # the packages the script imports (besides the standard library)
    runs_on_cpu: bool  # the failure shows without a GPU (dynamo fails while tracing)
    #: how a user applies each workaround to this cause's code (the suite's names)
    workarounds: Mapping[str, str] = field(default_factory=dict)

    def covers(self, check: Recorded) -> bool:
        if not any(fnmatch.fnmatchcase(check.name, n) for n in self.names):
            return False
        return bool(self.failure.search(check.cause) or self.failure.search(check.reason))


KNOWN: tuple[KnownCause, ...] = (
    KnownCause(
        key="diffusers-xformers-bool-mask",
        names=("masks.xformers.bool4d_*", "model.diffusers.qwenimage.xformers.*"),
        failure=re.compile(r"error above bound|error \S+ > bound"),
        title="xformers attention backend attends masked keys when attn_mask is a 4-D boolean tensor",
        summary=(
            '`dispatch_attention_fn(q, k, v, attn_mask=mask, backend="xformers")` with a boolean'
            " `[B,1,1,N]` mask returns attention over the keys the mask sets False: the backend"
            " turns a 4-D boolean mask into a bias with `.type_as(query)` (True -> 1.0, False ->"
            " 0.0) instead of 0 / -inf, so padding is attended"
        ),
        expected="the output of attention over the keys the mask keeps (a float64 reference)",
        needs=("torch", "xformers", "diffusers"),
        runs_on_cpu=False,
        workarounds={
            "mask-form": (
                "hand the xformers backend a mask form it converts correctly (a 2-D boolean"
                " `[B,N]` key mask, or an additive float mask: 0 where attended, -inf where masked)"
            ),
            "sdpa-instead": (
                'use diffusers\' native backend (`backend="native"`, the default), which replaces'
                " xformers"
            ),
            "sdpa-under-compile": (
                "use diffusers' native backend under `torch.compile`, which replaces xformers"
            ),
            "dynamo-disable": "call the attention behind `torch.compiler.disable`",
        },
    ),
    KnownCause(
        key="xformers-compiled-bias-backward",
        names=(
            "compile.xformers.*.backward",
            "compile.xformers.*.backward.*",
            "model.diffusers.qwenimage.xformers.training.compiled*",
        ),
        failure=re.compile(r"FakeTensor.?Device|two different devices", re.I),
        title=(
            "torch.compile of memory_efficient_attention with a tensor attn_bias fails in backward:"
            " FakeTensor device propagation in aten._efficient_attention_backward"
        ),
        summary=(
            "`torch.compile` of a function calling `xformers.ops.memory_efficient_attention(q, k,"
            " v, attn_bias=bias)` with a `[B,H,M,N]` tensor bias fails when its backward is"
            ' traced: "Unhandled FakeTensor Device Propagation for aten._efficient_attention_backward"'
        ),
        expected="forward and backward compile and run, gradients matching a float64 reference",
        needs=("torch", "xformers"),
        runs_on_cpu=False,
        workarounds={
            "dynamo-disable": (
                "call `memory_efficient_attention` behind `torch.compiler.disable` inside the"
                " compiled code"
            ),
            "sdpa-under-compile": (
                "use `torch.nn.functional.scaled_dot_product_attention` in the compiled code,"
                " which replaces xformers"
            ),
        },
    ),
    KnownCause(
        key="xformers-causal-fullgraph",
        names=("compile.xformers.causal.*",),
        failure=re.compile(r"op returned non-Tensor"),
        title=(
            "LowerTriangularMask() built inside torch.compile(fullgraph=True) fails to trace:"
            " torch.* op returned non-Tensor"
        ),
        summary=(
            "`xformers.ops.LowerTriangularMask()` constructed inside a function compiled with"
            ' `torch.compile(fullgraph=True)` stops dynamo: "Unsupported: torch.* op returned'
            ' non-Tensor" (without fullgraph, a graph break at every call)'
        ),
        expected="the function compiles as one graph and matches a float64 causal reference",
        needs=("torch", "xformers"),
        runs_on_cpu=True,
        workarounds={
            "mask-outside-compile": (
                "build `LowerTriangularMask()` once outside the compiled function and pass it in"
                " (keeps `fullgraph=True`)"
            ),
            "dynamo-disable": (
                "call `memory_efficient_attention` behind `torch.compiler.disable` inside the"
                " compiled code"
            ),
            "sdpa-under-compile": (
                "use `scaled_dot_product_attention(..., is_causal=True)` in the compiled code,"
                " which replaces xformers"
            ),
        },
    ),
)


def by_key(key: str) -> KnownCause | None:
    return next((c for c in KNOWN if c.key == key), None)


def cause_of(check: Recorded, *, by_name: bool = False) -> KnownCause | None:
    """The known cause of a failed ``check`` (None: no script shows its failure). With
    ``by_name`` (a check that did not fail, written anyway), the first cause of its family."""
    if check.suite_error:
        return None
    if by_name and not check.failed:
        return next(
            (c for c in KNOWN if any(fnmatch.fnmatchcase(check.name, n) for n in c.names)), None
        )
    return next((c for c in KNOWN if c.covers(check)), None) if check.failed else None


def sharing(run: RecordedRun, cause: KnownCause) -> list[Recorded]:
    """The failed checks of ``run`` that ``cause`` explains, direct checks first, by name."""
    found = [c for c in run.checks if c.failed and cause_of(c) is cause]
    return sorted(found, key=lambda c: (c.covers is not None, c.name))


def listed(checks: Sequence[Recorded], limit: int = 6) -> str:
    names = [c.name for c in checks]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
