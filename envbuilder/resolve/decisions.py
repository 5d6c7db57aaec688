"""Decisions: torch and xformers for one combination, from the evidence, as values.

`decide` reads the indexes only through an `Evidence` source and returns
a `Decision`: what was chosen, every rejected file with its reason, the
notes, and its status — ``decided`` (ready to be locked), ``unsatisfiable``
(a reason why the combination cannot work) or ``error`` (the evidence
could not be read). Nothing here does I/O of its own: a fake evidence
source with no HTTP server is enough to test it.

Each step (torch, then xformers' wheel or sdist) returns its choice with
what it found on the way, or a failure carrying what it found before it
stopped, so that an answer short of ``decided`` still lists the files
refused and the notes gathered; `decide` joins them in step order. The
steps live beside this module: `_steps` (what they read and return),
`_wheel_steps` (torch's wheel, xformers' wheel), `_build_check` (whether
xformers' wheel runs with that torch) and `_source_build` (xformers from
its sdist); whether a wheel or the sdist is taken follows the row's
``xformers-source``, here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from envbuilder.model import (
    Combination,
    IndexSpec,
    Rejection,
    ResolvedCombination,
    ResolvedTorch,
    ResolvedXformers,
    SourceBuild,
    Status,
)
from envbuilder.resolve._source_build import choose_source_build
from envbuilder.resolve._steps import (
    Chosen,
    Failed,
    Found,
    Inputs,
    XformersChoice,
    cuda_text,
    index_url,
)
from envbuilder.resolve._wheel_steps import choose_torch, choose_xformers_wheel
from envbuilder.resolve.closure import IndexArgument, PinnedFile
from envbuilder.resolve.evidence import Evidence
from envbuilder.target import Target

__all__ = ["Decision", "decide", "target_of"]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the evidence says about one combination, before its closure is locked."""

    combination: Combination
    target: Target
    status: Literal["decided", "unsatisfiable", "error"]
    reason: str = ""
    torch: ResolvedTorch | None = None
    xformers: ResolvedXformers | None = None
    extra_runtime: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    indexes: tuple[IndexArgument, ...] = ()
    dependencies: tuple[str, ...] = ()  # of torch and xformers, for the target
    raw_dependencies: tuple[str, ...] = ()  # the same, markers kept
    source_build: SourceBuild | None = None  # xformers from its sdist: what the build needs

    def result(self, status: Status, reason: str) -> ResolvedCombination:
        """The resolver's answer with this decision's findings."""
        c = self.combination
        return ResolvedCombination(
            combination=c,
            status=status,
            reason=reason,
            torch=self.torch,
            xformers=self.xformers,
            extra_runtime=self.extra_runtime,
            notes=self.notes,
            rejected=self.rejected,
            source_build=self.source_build,
        )

    def pins(self) -> list[PinnedFile]:
        """The files envbuilder chose itself, added to uv's closure."""
        assert self.torch is not None
        pinned = [_pinned("torch", self.torch)]
        # a source-built xformers is no file of the lock: its build group and record hold it
        if self.xformers is not None and self.source_build is None:
            pinned.append(_pinned("xformers", self.xformers))
        return pinned

    def closure_requirements(self) -> list[str]:
        """What the rest of the closure is resolved from, for the target."""
        return list(dict.fromkeys(self.dependencies + self.extra_runtime))

    def closure_key(self) -> tuple[object, ...]:
        """Decisions with the same key are locked from one universal resolution."""
        return (tuple(sorted(set(self.raw_dependencies + self.extra_runtime))), self.indexes)

    def resolved_reason(self) -> str:
        """The one-line account of a resolved combination."""
        assert self.torch is not None
        torch_cuda = f"CUDA {self.torch.cuda.version}" if self.torch.cuda else "CPU"
        text = f"torch {self.torch.version} ({torch_cuda}, from {self.torch.cuda_source})"
        if self.xformers is not None and self.source_build is not None:
            torch = self.torch.version
            if "+" not in torch and self.torch.cuda:
                torch += "+" + self.torch.cuda.tag
            return (
                f"xformers {self.xformers.version} built from source for torch {torch} "
                f"({self.source_build.why}); {text}"
            )
        if self.xformers is not None:
            built = self.xformers.built_with
            text += (
                f"; xformers {self.xformers.version} built with torch {built.torch}, "
                f"CUDA {cuda_text(built.cuda)}"
            )
            if self.xformers.requires_torch:
                text += f"; requires torch{self.xformers.requires_torch}"
        if self.extra_runtime:
            text += "; added " + ", ".join(self.extra_runtime)
        return text


@functools.cache
def target_of(python: str, platform: str) -> Target:
    """Targets are shared: their tag lists are long to compute."""
    return Target(python=python, platform=platform)


def decide(
    combination: Combination,
    evidence: Evidence,
    *,
    indexes: Mapping[str, IndexSpec],
    default_index_url: str,
) -> Decision:
    """Choose torch and xformers for ``combination`` from the evidence."""
    target = target_of(combination.python, combination.platform)
    default_spec = indexes.get("default", IndexSpec(name="default", url=None))
    default = IndexArgument(
        role="default", url=index_url(default_spec, str(combination.cuda), default_index_url)
    )
    inputs = Inputs(
        c=combination,
        target=target,
        evidence=evidence,
        indexes=indexes,
        default_index_url=default_index_url,
        default_url=default.url,
    )
    found = Found(indexes=(default,))

    def answer(
        found: Found,
        outcome: Failed | None,
        torch: ResolvedTorch | None = None,
        xformers: XformersChoice | None = None,
    ) -> Decision:
        status: Literal["decided", "unsatisfiable", "error"] = "decided"
        reason = ""
        chosen_xformers = xformers.xformers if xformers is not None else None
        if outcome is not None:
            status, reason, chosen_xformers = outcome.status, outcome.reason, outcome.xformers
        return Decision(
            combination=combination,
            target=target,
            status=status,
            reason=reason,
            torch=torch,
            xformers=chosen_xformers,
            extra_runtime=found.extra_runtime,
            notes=found.notes,
            rejected=found.rejected,
            indexes=found.indexes,
            dependencies=found.dependencies,
            raw_dependencies=found.raw_dependencies,
            source_build=xformers.source_build if xformers is not None else None,
        )

    torch = choose_torch(inputs)
    found += torch.found
    if isinstance(torch, Failed):
        return answer(found, torch)
    if combination.xformers is None:
        return answer(found, None, torch.value)
    xformers = _xformers(inputs, torch.value)
    found += xformers.found
    if isinstance(xformers, Failed):
        return answer(found, xformers, torch.value)
    return answer(found, None, torch.value, xformers.value)


def _xformers(inputs: Inputs, torch: ResolvedTorch) -> Chosen[XformersChoice] | Failed:
    """xformers' wheel, or its sdist and build group when the row asks for a source build."""
    c = inputs.c
    if c.xformers_source == "always":
        return choose_source_build(inputs, torch, "xformers-source = 'always'")
    wheel = choose_xformers_wheel(inputs, torch)
    if not isinstance(wheel, Failed):
        return Chosen(value=XformersChoice(xformers=wheel.value), found=wheel.found)
    if wheel.status == "unsatisfiable" and inputs.target.family == "macos":
        # no CUDA on macOS: no source build either, whatever the row's policy
        return replace(
            wheel,
            reason=f"{wheel.reason}; xformers' kernels are CUDA kernels and macOS has no CUDA, "
            "so no build of it runs there: a macOS row is torch alone",
        )
    if wheel.status != "unsatisfiable" or c.xformers_source != "when-no-wheel-fits":
        return wheel
    # the wheel is not used: its notes and dependencies go, what was refused and where stays
    kept = Found(rejected=wheel.found.rejected, indexes=wheel.found.indexes)
    built = choose_source_build(inputs, torch, f"no wheel fits: {wheel.reason}")
    if isinstance(built, Failed):
        return replace(built, found=kept + built.found)
    return Chosen(value=built.value, found=kept + built.found)


def _pinned(name: str, chosen: ResolvedTorch | ResolvedXformers) -> PinnedFile:
    return PinnedFile(
        name=name,
        version=chosen.version,
        filename=chosen.filename,
        url=chosen.url,
        sha256=chosen.sha256,
        size=chosen.size,
    )
