"""Choosing combinations from the lockfile (``query``, ``install``).

`answer` splits the lockfile into the combinations that fit the query, ranked
best first, and those that cannot run there, each with its reason: another
Python, another CPU architecture, a driver older than its CUDA release needs.

For a GPU (``--gpu``, or the one ``--here`` finds) the rank is by evidence on it:

| rank | the combination is                                                      |
|------|-------------------------------------------------------------------------|
| 1    | verified on this GPU model ("verified on H100")                         |
| 2    | verified on the same architecture ("verified on H200 (same              |
|      | architecture, sm_90)"): kernels are built per compute capability        |
| 3    | usable without xformers (its torch-alone row)                           |
| 4    | verified elsewhere only (another compute capability)                    |
| 5    | untested                                                                |
| 6    | broken                                                                  |
| 7    | unsatisfiable                                                           |

Within a rank, combinations that fit as asked come before those that need a
change: Python, CUDA and the driver are *suggestions* when changing them reaches a
combination verified on this architecture ("verified with Python 3.12: `uv venv
-p 3.12`, then …"), and filters otherwise. Without a GPU at all (``--here`` on a
machine with none) every CUDA build is rejected: nothing here can use CUDA.
Pure: the host is an argument (`Query`), `host.detect_host` reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from packaging.version import InvalidVersion, Version

from envbuilder.errors import InputError
from envbuilder.gpus import (
    arch_covering,
    arch_covers,
    compute_capability,
    gpu_arch,
    gpu_model,
    same_model,
    sm,
)
from envbuilder.lockfile.drivers import compatible_driver, driver_satisfies, driver_version
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
from envbuilder.target import CudaTag, normalise_arch, normalise_cuda, platform_family

__all__ = [
    "Answer",
    "Change",
    "Evidence",
    "Match",
    "Query",
    "Rejection",
    "Replacement",
    "answer",
    "asked_cuda",
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
    #: the GPU's model name (``--gpu H100``, or the one ``--here`` found), for "this GPU"
    gpu_name: str | None = None
    no_gpu: bool = False  # the host has no NVIDIA GPU: CUDA builds cannot run there
    #: the host's operating system (`envbuilder.consumer.host.host_family`): rows for another
    #: platform family (a Linux row on Windows) cannot serve it
    os: str | None = None
    #: with a GPU, list rows another Python/CUDA/driver would reach as suggestions (`query`);
    #: off, those are filters (`install` chooses among what fits as asked)
    suggest: bool = False


EvidenceKind = Literal["this-gpu", "same-architecture", "elsewhere"]
ChangeKind = Literal["python", "cuda", "driver"]
#: what a query may ask that a suggestion can change
CHANGEABLE: tuple[ChangeKind, ...] = ("python", "cuda", "driver")


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Where the combination was verified, seen from the queried GPU."""

    kind: EvidenceKind
    gpus: tuple[str, ...]  # the models, e.g. ("H200",)
    text: str  # "verified on H200 (same architecture, sm_90)"


@dataclass(frozen=True, kw_only=True)
class Change:
    """What the query asked that this combination needs otherwise."""

    kind: ChangeKind
    asked: str  # "3.11"
    needed: str  # "3.12"


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
    evidence: Evidence | None = None  # with a GPU: where it was verified
    changes: tuple[Change, ...] = ()  # what must change to use it (a suggestion), best first
    warnings: tuple[str, ...] = ()  # it runs, but short of full support (an older driver)

    @property
    def suggestion(self) -> str | None:
        """How to reach this combination when the query asked otherwise."""
        return suggestion(self.entry, self.changes) if self.changes else None


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


def asked_cuda(cuda: str) -> str:
    """A ``--cuda`` as a user types it (``12.1``, ``cu121``, `` CU121``, ``cpu``) spelled as
    combinations are (`envbuilder.target.normalise_cuda`); anything else is bad input."""
    normal = normalise_cuda(cuda.strip().lower())
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
    built = entry.torch_build.cuda if entry.torch_build else None
    return built is not None and built.tag == want


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
    arch = entry.xformers_build.built_with.arch_list if entry.xformers_build else None
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


RejectionKind = Literal["python", "arch", "driver", "cuda", "torch", "xformers", "gpu"]


def _ptx_only(entry: Entry, cc: str) -> bool:
    """Whether xformers' kernels reach *cc* only by PTX JIT (``9.0+PTX`` on a 10.0 GPU)."""
    arch = entry.xformers_build.built_with.arch_list if entry.xformers_build else None
    hit = arch_covering(arch, cc) if arch else None
    return hit is not None and hit.endswith("+PTX")


def driver_warning(entry: Entry, driver: str, cc: str | None) -> str | None:
    """Why *entry* runs on *driver* only by NVIDIA's minor-version compatibility (older than
    its full-support driver, not older than its major's floor, no PTX JIT on *cc*); None
    when the driver fully supports it, or when it cannot run there at all."""
    need = entry.minimum_driver
    if need is None or driver_satisfies(driver, need):
        return None
    floor = compatible_driver(entry.cuda_release)
    if floor is None or not driver_satisfies(driver, floor) or (cc and _ptx_only(entry, cc)):
        return None
    if entry.cuda_release is None:
        return None
    major = CudaTag.from_version(entry.cuda_release).major
    return (
        f"driver {driver.strip()} runs CUDA {major}.x builds by NVIDIA's minor-version "
        f"compatibility (from {floor}) unless PTX JIT is needed; recommended for CUDA "
        f"{entry.cuda_release}: {need} or newer"
    )


def _rejections(
    entry: Entry, query: Query, cuda: str | None, arch: str | None, cc: str | None = None
) -> list[tuple[RejectionKind, str]]:
    reasons: list[tuple[RejectionKind, str]] = []
    if query.python and entry.python != query.python:
        reasons.append(("python", f"Python {entry.python}, not {query.python}"))
    if query.os and (family := _family(entry.platform)) != query.os:
        reasons.append(("arch", f"for {entry.platform} ({family}), not a {query.os} host"))
    if arch and entry.arch != arch:
        implied = "" if query.arch else f" (a {query.gpu} host)"
        reasons.append(("arch", f"built for {entry.arch} ({entry.platform}), not {arch}{implied}"))
    if query.no_gpu and entry.cuda_release is not None:
        reasons.append(("gpu", f"a CUDA {entry.cuda_release} build, and no NVIDIA GPU here"))
    if (
        query.driver
        and entry.minimum_driver
        and not driver_satisfies(query.driver, entry.minimum_driver)
        and not driver_warning(entry, query.driver, cc)
    ):
        floor = compatible_driver(entry.cuda_release)
        have = query.driver.strip()
        if floor and driver_satisfies(have, floor):  # only PTX JIT stands in the way
            why = (
                f"xformers reaches {sm(cc or '?')} only by PTX JIT, which minor-version "
                "compatibility does not cover"
            )
        elif floor:
            why = f"not even minor-version compatibility's {floor}"
        else:
            why = "no minor-version compatibility known for it"
        reasons.append(
            (
                "driver",
                f"CUDA {entry.cuda_release} needs driver >= {entry.minimum_driver}, not {have} "
                f"({why})",
            )
        )
    if cuda and not _cuda_matches(cuda, entry):
        reasons.append(("cuda", f"CUDA {entry.cuda}, not {cuda}"))
    if query.torch and not _prefix(query.torch, entry.torch):
        reasons.append(("torch", f"torch {entry.torch or 'none'}, not {query.torch}"))
    if query.xformers and not _prefix(query.xformers, entry.xformers):
        reasons.append(("xformers", f"xformers {entry.xformers or 'none'}, not {query.xformers}"))
    return reasons


def _family(platform: str) -> str:
    try:
        return platform_family(platform)
    except ValueError:
        return "unknown"


def _label(gpu: GpuVerdict) -> str:
    return gpu_model(gpu.gpu) or gpu.gpu


def evidence(entry: Entry, cc: str, name: str | None, use: Use | None) -> Evidence | None:
    """Where *entry* is verified (for *use*), seen from a GPU of compute capability *cc*
    (model *name* when known): on that model, on its architecture, or elsewhere only."""
    good = [g for g in entry.gpus if _verdict(g, use).verdict in INSTALLABLE]
    mine = [g for g in good if name and same_model(g.gpu, name)]
    if mine:
        labels = tuple(dict.fromkeys(_label(g) for g in mine))
        return Evidence(kind="this-gpu", gpus=labels, text=f"verified on {', '.join(labels)}")
    same = [g for g in good if g.compute_capability == cc]
    if same:
        labels = tuple(dict.fromkeys(_label(g) for g in same))
        return Evidence(
            kind="same-architecture",
            gpus=labels,
            text=f"verified on {', '.join(labels)} (same architecture, {sm(cc)})",
        )
    if good:
        labels = tuple(dict.fromkeys(_label(g) for g in good))
        where = ", ".join(
            dict.fromkeys(f"{_label(g)} ({sm(g.compute_capability or '?')})" for g in good)
        )
        return Evidence(
            kind="elsewhere", gpus=labels, text=f"verified elsewhere: on {where}, not on {sm(cc)}"
        )
    return None


def suggestion(entry: Entry, changes: tuple[Change, ...]) -> str:
    """What to change to reach *entry*, as commands: ``verified with Python 3.12: `uv venv
    -p 3.12`, then `envbuilder install ID --python .venv```."""
    kinds = {c.kind: c for c in changes}
    parts: list[str] = []
    steps: list[str] = []
    if "python" in kinds:
        parts.append(f"Python {entry.python}")
    if "cuda" in kinds:
        parts.append(f"CUDA {entry.cuda} (its wheels carry the runtime)")
    if "driver" in kinds:
        parts.append(f"driver >= {kinds['driver'].needed}")
        steps.append("upgrade the NVIDIA driver")
    install = f"envbuilder install {entry.id}"
    if "python" in kinds:
        steps.append(f"`uv venv -p {entry.python}`")
        install += " --python .venv"
    steps.append(f"`{install}`")
    if len(steps) > 1:
        steps[-1] = "then " + steps[-1]
    return f"verified with {' and '.join(parts)}: {', '.join(steps)}"


def _rank(match: Match) -> tuple[int, int, int]:
    """(rank in the module's table, needs a change, evidence tier)."""
    v = match.verdict.verdict
    kind = match.evidence.kind if match.evidence is not None else None
    if v in INSTALLABLE:
        group = 0
    elif v == "xformers-unusable":
        group = 1
    elif v == "unverified":
        group = 2 if kind == "elsewhere" else 3
    else:
        group = 4 if v == "broken" else 5
    tier = {"this-gpu": 0, "same-architecture": 1}.get(kind or "", 2)
    return group, bool(match.changes), tier


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


def _change(kind: ChangeKind, entry: Entry, query: Query, cuda: str | None) -> Change:
    if kind == "python":
        return Change(kind=kind, asked=query.python or "", needed=entry.python)
    if kind == "cuda":
        return Change(kind=kind, asked=cuda or "", needed=entry.cuda)
    return Change(kind=kind, asked=(query.driver or "").strip(), needed=entry.minimum_driver or "")


def answer(lock: CompatLock, query: Query) -> Answer:
    """Every combination, either matching *query* (best verdict for its use first, then newest
    versions) or rejected with the reasons it cannot serve it."""
    cuda = asked_cuda(query.cuda) if query.cuda else None
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
        reasons = _rejections(entry, query, cuda, arch, cc)
        verdict = _gpu_verdict(entry, cc, query.use) if cc else _verdict(entry, query.use)
        changes: tuple[Change, ...] = ()
        # with a GPU, another Python, CUDA or driver is a suggestion where it reaches a
        # combination verified on this architecture
        if (
            reasons
            and query.suggest
            and cc is not None
            and verdict.verdict in INSTALLABLE
            and all(kind in CHANGEABLE for kind, _ in reasons)
        ):
            changes = tuple(_change(kind, entry, query, cuda) for kind, _ in reasons)  # type: ignore[arg-type]
        elif reasons:
            rejected.append(Rejection(entry=entry, reasons=tuple(text for _, text in reasons)))
            continue
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
                evidence=evidence(entry, cc, query.gpu_name or query.gpu, query.use)
                if cc
                else None,
                changes=changes,
                warnings=tuple(
                    w for w in [driver_warning(entry, query.driver or "", cc)] if w is not None
                )
                if query.driver
                else (),
            )
        )
    matches.sort(
        key=lambda m: (
            *(_rank(m) if cc else ()),
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
