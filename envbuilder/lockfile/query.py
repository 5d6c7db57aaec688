"""Choosing combinations from the lockfile (``query``, ``install``).

`answer` splits the lockfile into the combinations that fit the query, ranked
best first, and those that cannot run there, each with its reason: another
Python, another CPU architecture, a driver older than its CUDA release needs.
Pure: the host is an argument (`Query`), `host.detect_host` reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packaging.version import InvalidVersion, Version

from envbuilder.errors import InputError
from envbuilder.lockfile.drivers import driver_satisfies, driver_version
from envbuilder.lockfile.gpus import arch_covers, compute_capability, gpu_arch
from envbuilder.lockfile.host import normalise_arch
from envbuilder.lockfile.model import (
    INSTALLABLE,
    USES,
    VERDICT_RANK,
    CompatLock,
    Entry,
    GpuVerdict,
    LastVerified,
    Use,
    UseVerdict,
    Verdict,
    use_verdict,
)
from envbuilder.lockfile.verdicts import torch_alone_id, worst
from envbuilder.target import normalise_cuda as normalise_target_cuda

__all__ = [
    "Answer",
    "Match",
    "Query",
    "Rejection",
    "Replacement",
    "answer",
    "normalise_cuda",
    "replacement",
    "select",
]


@dataclass(frozen=True, kw_only=True)
class Query:
    python: str | None = None
    cuda: str | None = None
    torch: str | None = None
    xformers: str | None = None
    gpu: str | None = None
    use: Use | None = None  # rank by this use's verdict instead of the overall one
    arch: str | None = None  # the host's CPU architecture: x86_64, aarch64 (or amd64, arm64)
    driver: str | None = None  # the host's NVIDIA driver, e.g. 550.54.15


@dataclass(frozen=True, kw_only=True)
class Match:
    entry: Entry
    verdict: Verdict  # for the queried use and GPU when given, else the combination's overall
    compute_capability: str | None = None
    use: Use | None = None
    uses: tuple[UseVerdict, ...] = ()  # every use's verdict, for the queried GPU when given
    #: xformers-unusable: the combination without xformers (same Python, CUDA, torch) and its
    #: verdict for the same use and GPU, when that one is installable (verified, perhaps with
    #: a workaround); None otherwise
    replacement: Replacement | None = None


@dataclass(frozen=True, kw_only=True)
class Replacement:
    """The torch-alone combination a row whose xformers is unusable points to."""

    id: str
    verdict: Verdict


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """A combination that cannot serve the query, and every reason why."""

    entry: Entry
    reasons: tuple[str, ...]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True, kw_only=True)
class Answer:
    matches: tuple[Match, ...]  # best first
    rejected: tuple[Rejection, ...]  # in the lockfile's order


def normalise_cuda(cuda: str) -> str:
    """``12.1`` / ``cu121`` / ``CU121`` -> ``cu121``; ``cpu`` and ``default`` stay."""
    normal = normalise_target_cuda(cuda.strip().lower())
    if normal is None:
        raise InputError(f"bad --cuda {cuda!r}: give 12.1, cu121, cpu or default")
    return normal


def _prefix(want: str, have: str | None) -> bool:
    if have is None:
        return False
    return have == want or have.startswith((want + ".", want + "+"))


def _cuda_matches(want: str, entry: Entry) -> bool:
    if entry.cuda == want:
        return True
    built = (entry.torch_build or {}).get("cuda")
    return isinstance(built, str) and normalise_cuda(built) == want


def _verdict(record: Entry | GpuVerdict | LastVerified, use: Use | None) -> Verdict:
    return record.verdict if use is None else use_verdict(record.uses, use)


def _gpu_verdict(entry: Entry, cc: str, use: Use | None) -> Verdict:
    if entry.verdict.verdict == "unsatisfiable":
        return entry.verdict
    mine = [g for g in entry.gpus if g.compute_capability == cc]
    if mine:
        chosen = worst(_verdict(g, use) for g in mine)
        names = ", ".join(g.gpu for g in mine)
        return replace(chosen, reason=f"on {names}: {chosen.reason}")
    arch = ((entry.xformers_build or {}).get("built_with") or {}).get("arch_list")
    sm = "sm_" + cc.replace(".", "")
    if isinstance(arch, str) and arch and not arch_covers(arch, cc):
        return Verdict(
            verdict="broken",
            reason=f"predicted: xformers was built for TORCH_CUDA_ARCH_LIST={arch!r}, "
            f"which has no kernels for {sm}",
        )
    tested = ", ".join(f"{g.gpu} ({_verdict(g, use).verdict})" for g in entry.gpus) or "none"
    reason = f"no results on a {sm} GPU (tested on: {tested})"
    last = entry.last_verified
    if not entry.gpus and last is not None:
        reason += f"; {last.describe(_verdict(last, use))}"
    return Verdict(verdict="unverified", reason=reason)


def _version_key(text: str | None) -> Version:
    try:
        return Version(text or "0")
    except InvalidVersion:
        return Version("0")


def _rejections(entry: Entry, query: Query, cuda: str | None, arch: str | None) -> list[str]:
    reasons = []
    if query.python and entry.python != query.python:
        reasons.append(f"Python {entry.python}, not {query.python}")
    if arch and entry.arch != arch:
        implied = "" if query.arch else f" (a {query.gpu} host)"
        reasons.append(f"built for {entry.arch} ({entry.platform}), not {arch}{implied}")
    if (
        query.driver
        and entry.minimum_driver
        and not driver_satisfies(query.driver, entry.minimum_driver)
    ):
        reasons.append(
            f"CUDA {entry.cuda_release} needs driver >= {entry.minimum_driver}, "
            f"not {query.driver.strip()}"
        )
    if cuda and not _cuda_matches(cuda, entry):
        reasons.append(f"CUDA {entry.cuda}, not {cuda}")
    if query.torch and not _prefix(query.torch, entry.torch):
        reasons.append(f"torch {entry.torch or 'none'}, not {query.torch}")
    if query.xformers and not _prefix(query.xformers, entry.xformers):
        reasons.append(f"xformers {entry.xformers or 'none'}, not {query.xformers}")
    return reasons


def replacement(
    lock: CompatLock, entry: Entry, use: Use | None, cc: str | None = None
) -> Replacement | None:
    """The torch-alone combination of *entry* (`torch_alone_id`) when it is installable for
    *use* (overall without one) on GPUs of compute capability *cc* (any without one)."""
    alone_id = torch_alone_id(entry.id)
    alone = lock.by_id().get(alone_id) if alone_id else None
    if alone is None or alone.lock is None:
        return None
    verdict = _gpu_verdict(alone, cc, use) if cc else _verdict(alone, use)
    return Replacement(id=alone.id, verdict=verdict) if verdict.verdict in INSTALLABLE else None


def answer(lock: CompatLock, query: Query) -> Answer:
    """Every combination, either matching *query* (best verdict for its use first, then newest
    versions) or rejected with the reasons it cannot serve it."""
    cuda = normalise_cuda(query.cuda) if query.cuda else None
    # a Grace superchip (GH200, GB200) is an ARM host even when --arch is not given
    arch = normalise_arch(query.arch) if query.arch else gpu_arch(query.gpu or "")
    if query.driver:
        driver_version(query.driver)  # refuse a malformed one before judging anything
    cc = None
    if query.gpu:
        recorded = [(g.gpu, g.compute_capability) for e in lock.combinations for g in e.gpus]
        cc = compute_capability(query.gpu, recorded)
    matches: list[Match] = []
    rejected: list[Rejection] = []
    for entry in lock.combinations:
        reasons = _rejections(entry, query, cuda, arch)
        if reasons:
            rejected.append(Rejection(entry=entry, reasons=tuple(reasons)))
            continue
        verdict = _gpu_verdict(entry, cc, query.use) if cc else _verdict(entry, query.use)
        uses = tuple(
            UseVerdict(use=u, verdict=_gpu_verdict(entry, cc, u) if cc else _verdict(entry, u))
            for u in USES
        )
        alternative = (
            replacement(lock, entry, query.use, cc)
            if verdict.verdict == "xformers-unusable"
            else None
        )
        matches.append(
            Match(
                entry=entry,
                verdict=verdict,
                compute_capability=cc,
                use=query.use,
                uses=uses,
                replacement=alternative,
            )
        )
    matches.sort(
        key=lambda m: (
            VERDICT_RANK[m.verdict.verdict],
            tuple(-p for p in _version_key(m.entry.torch).release),
            tuple(-p for p in _version_key(m.entry.xformers).release),
            tuple(-p for p in _version_key(m.entry.python).release),
            m.entry.id,
        )
    )
    return Answer(matches=tuple(matches), rejected=tuple(rejected))


def select(lock: CompatLock, query: Query) -> list[Match]:
    """The combinations matching *query*, best verdict (for its use) first, then newest versions."""
    return list(answer(lock, query).matches)
