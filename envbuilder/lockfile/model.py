"""The compatibility lockfile's records (``schema = "envbuilder.compat/4"``).

Written by ``envbuilder lock``, read by ``query``, ``export``, ``install``,
``doctor`` and ``publish``. The JSON shape is fixed by
``envbuilder/schemas/compat.schema.json``; these dataclasses are its typed view.
This module imports only the standard library and the shared vocabulary: the
suite's stdlib-only record module (check statuses, uses, workarounds), the
resolver's records (`envbuilder.model`) and the target (``packaging``), so that
``doctor`` works in any environment that has envbuilder's declared dependencies.

The evidence (checks, runs, verdicts, last verified) is `envbuilder.lockfile.evidence`;
its names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from envbuilder.conformance._record import USES, Use
from envbuilder.lockfile.evidence import (
    INSTALLABLE,
    VERDICT_RANK,
    VERDICTS,
    Advisory,
    CheckOutcome,
    GpuVerdict,
    InfoCheck,
    LastVerified,
    Measurement,
    Run,
    Scalar,
    UseVerdict,
    Verdict,
    VerdictName,
    WorkaroundChoice,
    WorkaroundCost,
    WorkaroundOption,
    _one_of,
    run_date,
    use_verdict,
    use_verdicts_from_json,
)
from envbuilder.model import STATUSES as RESOLVE_STATUSES
from envbuilder.model import (
    BuildRecord,
    Combination,
    CudaSource,
    ResolvedCombination,
    ResolvedTorch,
    ResolvedXformers,
)
from envbuilder.model import Status as ResolveStatus
from envbuilder.target import CudaTag, read_cuda_build

__all__ = [
    "COMPAT_SCHEMA",
    "DEFAULT_LOCKFILE",
    "INSTALLABLE",
    "READABLE_COMPAT_SCHEMAS",
    "USES",
    "VERDICTS",
    "VERDICT_RANK",
    "Advisory",
    "CheckOutcome",
    "CompatLock",
    "DriverTable",
    "Entry",
    "GpuVerdict",
    "InfoCheck",
    "LastVerified",
    "LockPointer",
    "Measurement",
    "PackagePin",
    "RejectedResults",
    "RetiredEntry",
    "Run",
    "Scalar",
    "SourceBuildEntry",
    "TorchBuild",
    "Use",
    "UseVerdict",
    "Verdict",
    "VerdictName",
    "WorkaroundChoice",
    "WorkaroundCost",
    "WorkaroundOption",
    "XformersBuild",
    "run_date",
    "use_verdict",
    "use_verdicts_from_json",
]

#: /2 added the per-use verdicts and the check status ``invalid``: a /1 reader
#: would count an ``invalid`` check as neither passed nor failed; stale evidence
#: (each run's ``lock_sha256``, ``stale_runs``, ``last_verified``) and what a
#: host needs (each combination's ``arch``, ``cuda_release`` and
#: ``minimum_driver``, the lockfile's ``drivers`` table) came with it.
#: /3 keeps evidence across runs: the ``retired`` section (runs of combinations no longer
#: resolved), ``last_verified`` on every entry with runs (a /2 reader took it for stale
#: evidence) and each run's ``date``; and it tells workarounds that keep xformers from those
#: that replace it: the verdict ``xformers-unusable`` (a /2 reader cannot rank it) and each
#: verdict's ``options``. An entry's optional ``source_build`` (xformers built from its sdist,
#: and the build record of the wheel that was measured) came later within /3: a reader that
#: does not know it installs nothing for such an entry (its lock holds no xformers wheel).
#: /4 judges what the combination pins apart from the libraries the suite reaches it through:
#: each check's ``via`` (a /3 reader would count a diffusers check against the kernels), each
#: verdict's ``advisories`` (that library's own verdict) and ``suite_errors`` (checks whose
#: error was the suite's, counted nowhere), and workaround costs per call and per step with
#: their tier (ranked by it, never by step time).
COMPAT_SCHEMA = "envbuilder.compat/4"
#: The schemas readers accept. A /2 or /3 file is read as a /4 one whose checks take their
#: ``via`` from their names (`legacy_via`) and is judged again on read (`recheck`); a /2 file
#: has no retired combinations.
READABLE_COMPAT_SCHEMAS: tuple[str, ...] = (
    "envbuilder.compat/2",
    "envbuilder.compat/3",
    COMPAT_SCHEMA,
)
#: The lockfile's name at the repository root (and in the published site).
DEFAULT_LOCKFILE = "compat.lock.json"


@dataclass(frozen=True, kw_only=True)
class PackagePin:
    """One package of the combination's closure, as its pylock pins it."""

    name: str
    version: str | None
    marker: str | None
    wheels: tuple[tuple[str, str], ...]  # (filename, sha256)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "marker": self.marker,
            "wheels": [{"filename": f, "sha256": h} for f, h in self.wheels],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PackagePin:
        return cls(
            name=data["name"],
            version=data.get("version"),
            marker=data.get("marker"),
            wheels=tuple((w["filename"], w["sha256"]) for w in data.get("wheels", ())),
        )


@dataclass(frozen=True, kw_only=True)
class TorchBuild:
    """The torch wheel a combination resolved to and the CUDA it is built for; the
    resolver's `ResolvedTorch` without its URL (the combination's pylock holds that)."""

    version: str
    cuda: CudaTag | None  # None: a CPU build; written as its version, "12.8"
    cuda_source: CudaSource
    filename: str
    sha256: str
    size: int | None
    index: str

    @classmethod
    def of(cls, resolved: ResolvedTorch) -> TorchBuild:
        return cls(
            version=resolved.version,
            cuda=resolved.cuda,
            cuda_source=resolved.cuda_source,
            filename=resolved.filename,
            sha256=resolved.sha256,
            size=resolved.size,
            index=resolved.index,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "cuda": None if self.cuda is None else self.cuda.version,
            "cuda_source": self.cuda_source,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
            "index": self.index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchBuild:
        cuda = data["cuda"]
        return cls(
            version=data["version"],
            cuda=None if cuda is None else CudaTag.from_version(cuda),
            cuda_source=_one_of(data["cuda_source"], _CUDA_SOURCES, "torch's CUDA source"),
            filename=data["filename"],
            sha256=data["sha256"],
            size=data.get("size"),
            index=data.get("index", "default"),
        )


_CUDA_SOURCES: tuple[CudaSource, ...] = ("local-label", "requires-dist", "none")


@dataclass(frozen=True, kw_only=True)
class XformersBuild:
    """The xformers file a combination resolved to (a wheel, or the sdist it is built from)
    and the build record it carries; the resolver's `ResolvedXformers` without its URL."""

    version: str
    filename: str
    sha256: str
    requires_torch: str
    built_with: BuildRecord
    size: int | None
    index: str

    @classmethod
    def of(cls, resolved: ResolvedXformers) -> XformersBuild:
        return cls(
            version=resolved.version,
            filename=resolved.filename,
            sha256=resolved.sha256,
            requires_torch=resolved.requires_torch,
            built_with=resolved.built_with,
            size=resolved.size,
            index=resolved.index,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "filename": self.filename,
            "sha256": self.sha256,
            "requires_torch": self.requires_torch,
            "built_with": self.built_with.to_json(),
            "size": self.size,
            "index": self.index,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> XformersBuild:
        return cls(
            version=data["version"],
            filename=data["filename"],
            sha256=data["sha256"],
            requires_torch=data.get("requires_torch", ""),
            built_with=BuildRecord.from_json(data["built_with"]),
            size=data.get("size"),
            index=data.get("index", "default"),
        )


@dataclass(frozen=True, kw_only=True)
class LockPointer:
    """Where the combination's ``pylock.<id>.toml`` lies, relative to the lockfile."""

    path: str
    sha256: str
    requirements: str | None = None


@dataclass(frozen=True, kw_only=True)
class SourceBuildEntry:
    """A combination whose xformers is built from its sdist, and the build that was measured.

    A CUDA build is not byte-reproducible, so the record pins the one wheel that was built
    (``envbuilder build-wheel``) and that the runs installed. Without a build record every
    field after ``arch_list`` is None: the combination has not been built yet."""

    sdist_sha256: str
    arch_list: tuple[str, ...]
    record: str | None = None  # the build record, relative to the lockfile
    key: str | None = None  # the build key (sha256 of its inputs)
    key_format: int | None = None  # the recipe's version the key was made with
    mode: str | None = None  # "in-place" or "docker"
    toolchain: str | None = None  # "host" (the host's nvcc) or "wheels" (the locked ones)
    wheel_filename: str | None = None
    wheel_sha256: str | None = None
    wheel_size: int | None = None
    #: the sha256 of each compiled library in the wheel (``xformers/_C.so``), from its RECORD;
    #: a run's ``runner.xformers_libraries`` must agree
    wheel_libraries: Mapping[str, str] | None = None
    cpp_lib: Mapping[str, Any] | None = None  # the wheel's xformers/cpp_lib.json

    @property
    def built(self) -> bool:
        return self.key is not None and self.wheel_sha256 is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "sdist_sha256": self.sdist_sha256,
            "arch_list": list(self.arch_list),
            "record": self.record,
            "key": self.key,
            "key_format": self.key_format,
            "mode": self.mode,
            "toolchain": self.toolchain,
            "wheel": None
            if self.wheel_sha256 is None
            else {
                "filename": self.wheel_filename,
                "sha256": self.wheel_sha256,
                "size": self.wheel_size,
                "libraries": None if self.wheel_libraries is None else dict(self.wheel_libraries),
            },
            "cpp_lib": None if self.cpp_lib is None else dict(self.cpp_lib),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceBuildEntry:
        wheel = data.get("wheel") or {}
        cpp_lib = data.get("cpp_lib")
        return cls(
            sdist_sha256=data["sdist_sha256"],
            arch_list=tuple(data.get("arch_list", ())),
            record=data.get("record"),
            key=data.get("key"),
            key_format=data.get("key_format"),
            mode=data.get("mode"),
            toolchain=data.get("toolchain"),
            wheel_filename=wheel.get("filename"),
            wheel_sha256=wheel.get("sha256"),
            wheel_size=wheel.get("size"),
            wheel_libraries=wheel.get("libraries"),
            cpp_lib=dict(cpp_lib) if cpp_lib is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One combination in the lockfile: the resolver's answer, nested, and what was measured.

    ``resolved`` is the resolution's record of the combination; ``id``, ``python``, ``cuda``,
    ``platform``, ``torch``, ``xformers``, ``status``, ``resolver_reason``, the builds,
    ``extra_runtime`` and ``notes`` are its, read through it. The JSON stays flat (those
    keys beside the lockfile's own), so an entry read back holds only what the lockfile
    records of the answer (`_resolved_of`): no URLs (the entry's pylock holds them), no
    rejected candidates, and the matrix cell's settings the lockfile does not name at their
    defaults."""

    resolved: ResolvedCombination
    arch: str  # the CPU architecture its platform tag names: "x86_64", "aarch64"
    cuda_release: str | None  # the newest CUDA its binaries were built with ("13.0"); None: CPU
    minimum_driver: str | None  # the NVIDIA driver that release needs (`CompatLock.drivers`)
    lock: LockPointer | None
    packages: tuple[PackagePin, ...]
    runs: tuple[Run, ...]  # on the current lock: the verdict is made of these
    stale_runs: tuple[Run, ...] = ()  # on older locks of this combination: kept, not counted
    last_verified: LastVerified | None = None  # `runs`; without runs the newest stale lock's
    gpus: tuple[GpuVerdict, ...]
    uses: tuple[UseVerdict, ...]  # per use the worst of the GPUs, in `USES` order
    verdict: Verdict  # the worst of `uses`
    #: xformers built from its sdist; None (and absent from the JSON) for a wheel from an index
    source_build: SourceBuildEntry | None = None

    @property
    def id(self) -> str:
        return self.resolved.id

    @property
    def python(self) -> str:
        return self.resolved.python

    @property
    def cuda(self) -> str:
        """The cell's CUDA as ids spell it: ``cu121``, ``cpu`` or ``default``."""
        return self.resolved.cuda

    @property
    def platform(self) -> str:
        """The wheel platform tag resolved for, e.g. ``manylinux_2_28_x86_64``."""
        return self.resolved.platform

    @property
    def torch(self) -> str | None:
        """The resolved torch's version, else the one the cell asked for."""
        if self.resolved.torch is not None:
            return self.resolved.torch.version
        requested = self.resolved.requested
        return requested.torch if requested else None

    @property
    def xformers(self) -> str | None:
        """The resolved xformers' version, else the one the cell asked for."""
        if self.resolved.xformers is not None:
            return self.resolved.xformers.version
        requested = self.resolved.requested
        return requested.xformers if requested else None

    @property
    def status(self) -> ResolveStatus:
        """The resolver's status."""
        return self.resolved.status

    @property
    def resolver_reason(self) -> str:
        return self.resolved.reason

    @property
    def torch_build(self) -> TorchBuild | None:
        return None if self.resolved.torch is None else TorchBuild.of(self.resolved.torch)

    @property
    def xformers_build(self) -> XformersBuild | None:
        xformers = self.resolved.xformers
        return None if xformers is None else XformersBuild.of(xformers)

    @property
    def extra_runtime(self) -> tuple[str, ...]:
        return self.resolved.extra_runtime

    @property
    def notes(self) -> tuple[str, ...]:
        return self.resolved.notes

    @property
    def installable(self) -> bool:
        return self.lock is not None

    def to_json(self) -> dict[str, Any]:
        torch_build, xformers_build = self.torch_build, self.xformers_build
        data: dict[str, Any] = {
            "id": self.id,
            "python": self.python,
            "cuda": self.cuda,
            "platform": self.platform,
            "arch": self.arch,
            "cuda_release": self.cuda_release,
            "minimum_driver": self.minimum_driver,
            "torch": self.torch,
            "xformers": self.xformers,
            "status": self.status,
            "resolver_reason": self.resolver_reason,
            "lock": None if self.lock is None else asdict(self.lock),
            "packages": [p.to_json() for p in self.packages],
            "torch_build": None if torch_build is None else torch_build.to_json(),
            "xformers_build": None if xformers_build is None else xformers_build.to_json(),
            "extra_runtime": list(self.extra_runtime),
            "notes": list(self.notes),
            "runs": [asdict(r) for r in self.runs],
            "stale_runs": [asdict(r) for r in self.stale_runs],
            "last_verified": None if self.last_verified is None else asdict(self.last_verified),
            "gpus": [asdict(g) for g in self.gpus],
            "uses": [asdict(u) for u in self.uses],
            "verdict": asdict(self.verdict),
        }
        if self.source_build is not None:  # entries of wheels from an index stay as they were
            data["source_build"] = self.source_build.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        lock = data.get("lock")
        last = data.get("last_verified")
        pointer = LockPointer(**lock) if lock else None
        return cls(
            resolved=_resolved_of(data, pointer),
            arch=data["arch"],
            cuda_release=data.get("cuda_release"),
            minimum_driver=data.get("minimum_driver"),
            lock=pointer,
            packages=tuple(PackagePin.from_json(p) for p in data.get("packages", ())),
            runs=tuple(Run.from_json(r) for r in data.get("runs", ())),
            stale_runs=tuple(Run.from_json(r) for r in data.get("stale_runs", ())),
            last_verified=LastVerified.from_json(last) if last else None,
            gpus=tuple(GpuVerdict.from_json(g) for g in data.get("gpus", ())),
            uses=use_verdicts_from_json(data["uses"]),
            verdict=Verdict.from_json(data["verdict"]),
            source_build=(
                SourceBuildEntry.from_json(data["source_build"])
                if data.get("source_build") is not None
                else None
            ),
        )


def _resolved_of(data: Mapping[str, Any], lock: LockPointer | None) -> ResolvedCombination:
    """The resolver's answer as a lockfile entry records it (flat, beside the entry's own keys).

    A lockfile records no URLs (they read as ``""``: the entry's pylock holds them), no
    rejected candidates and no paths of the resolver's output; the cell's torch and xformers
    are the versions the entry names (public part), its other matrix settings the defaults,
    apart from ``add_cuda_runtime``, which its extra runtime shows."""
    cid = data["id"]
    if not isinstance(cid, str):
        raise ValueError(f"a combination's id is {cid!r}, not a string")
    cuda = read_cuda_build(data["cuda"], f"combination {cid!r}")
    torch = TorchBuild.from_json(data["torch_build"]) if data.get("torch_build") else None
    xformers = (
        XformersBuild.from_json(data["xformers_build"]) if data.get("xformers_build") else None
    )
    for name, build in (("torch", torch), ("xformers", xformers)):
        if build is not None and data.get(name) != build.version:
            raise ValueError(
                f"combination {cid!r}: {name} {data.get(name)!r} is not the version of its "
                f"{name}_build ({build.version!r}); regenerate the lockfile with `nox -s lock`"
            )
    extra_runtime = tuple(data.get("extra_runtime", ()))
    cell = Combination(
        id=cid,
        python=data["python"],
        cuda=cuda,
        platform=data["platform"],
        torch=str(data.get("torch") or "").partition("+")[0],
        xformers=data.get("xformers"),
        add_cuda_runtime=bool(extra_runtime) or cid.endswith("-cudart"),
    )
    return ResolvedCombination(
        combination=cell,
        status=_one_of(data["status"], RESOLVE_STATUSES, "resolver status"),
        reason=data.get("resolver_reason", ""),
        torch=None
        if torch is None
        else ResolvedTorch(
            version=torch.version,
            cuda=torch.cuda,
            cuda_source=torch.cuda_source,
            filename=torch.filename,
            url="",
            sha256=torch.sha256,
            size=torch.size,
            index=torch.index,
        ),
        xformers=None
        if xformers is None
        else ResolvedXformers(
            version=xformers.version,
            filename=xformers.filename,
            url="",
            sha256=xformers.sha256,
            requires_torch=xformers.requires_torch,
            built_with=xformers.built_with,
            size=xformers.size,
            index=xformers.index,
        ),
        extra_runtime=extra_runtime,
        notes=tuple(data.get("notes", ())),
        lock_sha256=None if lock is None else lock.sha256,
    )


def _cuda_spelling(data: Mapping[str, Any], what: str) -> str | None:
    """A record's ``cuda`` as ids spell it (``cu121``, ``cpu``, ``default``), checked;
    None where the record names none."""
    where = f"{what} {data.get('id')!r}"
    match data:
        case {"cuda": None}:
            return None
        case {"cuda": value}:
            if str(read_cuda_build(value, where)) != value:
                raise ValueError(f"{where}: cuda {value!r} is not a CUDA value as ids spell it")
            return str(value)
    return None


@dataclass(frozen=True, kw_only=True)
class RetiredEntry:
    """A combination the resolution no longer has, kept for its runs (never offered).

    A selector run, a matrix.toml change or an upgrade drops a row; what was measured on it
    stays here, with the verdict and date of its newest lock's runs (`last_verified`). The
    axes are those of its last entry, or None when only results files named it."""

    id: str
    python: str | None
    cuda: str | None
    platform: str | None
    torch: str | None
    xformers: str | None
    extra_runtime: tuple[str, ...]  # its runs were judged with these, as its entry's were
    runs: tuple[Run, ...]  # every run, on any lock
    last_verified: LastVerified

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetiredEntry:
        return cls(
            id=data["id"],
            python=data.get("python"),
            cuda=_cuda_spelling(data, "retired combination"),
            platform=data.get("platform"),
            torch=data.get("torch"),
            xformers=data.get("xformers"),
            extra_runtime=tuple(data.get("extra_runtime", ())),
            runs=tuple(Run.from_json(r) for r in data.get("runs", ())),
            last_verified=LastVerified.from_json(data["last_verified"]),
        )


@dataclass(frozen=True, kw_only=True)
class RejectedResults:
    file: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class DriverTable:
    """The minimum NVIDIA driver per CUDA release the lockfile was judged with, and its source."""

    source: str
    minimum: Mapping[str, str]  # "13.0" -> "580.65.06"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriverTable:
        return cls(source=data["source"], minimum=dict(data["minimum"]))


@dataclass(frozen=True, kw_only=True)
class CompatLock:
    """The whole lockfile. ``content_sha256`` is added when written, checked when read."""

    generated_by: str
    resolution: Mapping[str, Any]  # {"path", "matrix", "matrix_sha256"}
    combinations: tuple[Entry, ...]
    drivers: DriverTable
    rejected_results: tuple[RejectedResults, ...] = ()
    retired: tuple[RetiredEntry, ...] = ()  # by id
    schema: str = COMPAT_SCHEMA

    def by_id(self) -> dict[str, Entry]:
        return {e.id: e for e in self.combinations}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "generated_by": self.generated_by,
            "resolution": dict(self.resolution),
            "combinations": [e.to_json() for e in self.combinations],
            "drivers": {"source": self.drivers.source, "minimum": dict(self.drivers.minimum)},
            "rejected_results": [asdict(r) for r in self.rejected_results],
            "retired": [asdict(r) for r in self.retired],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompatLock:
        return cls(
            schema=data["schema"],
            generated_by=data["generated_by"],
            resolution=dict(data["resolution"]),
            combinations=tuple(Entry.from_json(e) for e in data["combinations"]),
            drivers=DriverTable.from_json(data["drivers"]),
            rejected_results=tuple(RejectedResults(**r) for r in data.get("rejected_results", ())),
            retired=tuple(RetiredEntry.from_json(r) for r in data.get("retired", ())),
        )
