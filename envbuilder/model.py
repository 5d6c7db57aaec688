"""Records that flow between the pipeline's stages.

matrix -> `Combination`; resolve -> `ResolvedCombination` (written to
``<out>/resolution.json`` and printed by ``envbuilder resolve --json``).
Every later stage (docker, conformance, lock, publish) reads these records,
never the resolver's internals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from envbuilder.errors import InputError
from envbuilder.target import CudaBuild, CudaTag, read_cuda_build

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: One path component of an image repository name, as the registry API defines it.
_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")

__all__ = [
    "READABLE_RESOLUTION_SCHEMAS",
    "RESOLUTION_SCHEMA",
    "STATUSES",
    "BuildRecord",
    "Combination",
    "CudaSource",
    "IndexKind",
    "IndexSpec",
    "Rejection",
    "Resolution",
    "ResolvedCombination",
    "ResolvedTorch",
    "ResolvedXformers",
    "SourceBuild",
    "SourceFile",
    "Status",
    "XformersSource",
    "build_lock_filename",
    "image_tag",
    "legacy_build_lock_filename",
    "load_resolution",
    "lock_filename",
    "requirements_filename",
    "results_filename",
    "suite_lock_filename",
    "suite_requirements_filename",
    "verified_lock",
]

#: /2 nests each answer's matrix cell (``combination``: the `Combination` it answers, every
#: field) where /1 copied four of its fields (``id``, ``python``, ``cuda``, ``platform``) and
#: the versions it asked for (``requested``). A /1 file is still read: its cells get the
#: matrix defaults for what it did not record (indexes, runner, base image, note).
RESOLUTION_SCHEMA = "envbuilder.resolution/2"
READABLE_RESOLUTION_SCHEMAS = ("envbuilder.resolution/1", RESOLUTION_SCHEMA)

Status = Literal["resolved", "unsatisfiable", "error"]
STATUSES: tuple[Status, ...] = ("resolved", "unsatisfiable", "error")
#: how an index is read: a Simple Repository API base, or a flat page of files (--find-links)
IndexKind = Literal["simple", "find-links"]
#: where torch's CUDA was read: its local version label, its CUDA runtime pin, or neither
CudaSource = Literal["local-label", "requires-dist", "none"]
#: whether xformers is built from its sdist: never, always, or only when no wheel fits
XformersSource = Literal["never", "always", "when-no-wheel-fits"]


@dataclass(frozen=True, kw_only=True)
class IndexSpec:
    """A named package index from ``matrix.toml``.

    ``url`` is a fixed Simple API base or a template containing ``{cuda}``
    (a PyTorch-style per-CUDA index such as ``<base>/{cuda}``). ``projects``
    lists the projects it serves; empty means every project. ``url`` is None
    for the default index, which is taken from the user's pip configuration
    at run time.
    """

    name: str
    url: str | None
    projects: tuple[str, ...] = ()
    #: "simple" = a Simple Repository API base (PEP 503/691); "find-links" = a flat
    #: directory or HTML page of files (pip's --find-links), e.g. a local build of torch.
    kind: IndexKind = "simple"

    @property
    def per_cuda(self) -> bool:
        return self.url is not None and "{cuda}" in self.url

    def url_for(self, cuda: str) -> str | None:
        if self.url is None:
            return None
        return self.url.replace("{cuda}", cuda) if self.per_cuda else self.url


@dataclass(frozen=True, kw_only=True)
class Combination:
    """One cell of the matrix: the target a set of wheels must fit."""

    id: str
    python: str  # "3.11"
    cuda: CudaBuild  # CUDA 12.1 (str(): "cu121"), "default" or "cpu"
    torch: str  # "2.4.1"
    xformers: str | None  # "0.0.28.post1"; None = torch alone
    platform: str = "manylinux_2_28_x86_64"
    torch_index: str = "default"  # name of an IndexSpec
    xformers_index: str = "default"
    add_cuda_runtime: bool = False  # opt in: add the CUDA runtime xformers' build needs
    base_image: str | None = None
    runner: tuple[str, ...] = ()  # GitHub runner labels
    note: str = ""
    xformers_source: XformersSource = "never"
    #: TORCH_CUDA_ARCH_LIST entries a source build compiles for ("9.0", "10.0+PTX"), sorted
    cuda_archs: tuple[str, ...] = ()

    @property
    def lock_file(self) -> str:
        """``pylock.<name>.toml``: its lock (`lock_filename`)."""
        return lock_filename(self.id)

    @property
    def requirements_file(self) -> str:
        """``requirements.<id>.txt``: its lock for ``pip install --require-hashes``."""
        return requirements_filename(self.id)

    @property
    def results_file(self) -> str:
        """``<id>.json``: the conformance suite's results for it."""
        return results_filename(self.id)

    def image_tag(self, lock_sha256: str) -> str:
        """The image built from its lock of *lock_sha256* (`image_tag`)."""
        return image_tag(self.id, lock_sha256)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "python": self.python,
            "cuda": str(self.cuda),
            "torch": self.torch,
            "xformers": self.xformers,
            "platform": self.platform,
            "torch_index": self.torch_index,
            "xformers_index": self.xformers_index,
            "add_cuda_runtime": self.add_cuda_runtime,
            "base_image": self.base_image,
            "runner": list(self.runner),
            "note": self.note,
            "xformers_source": self.xformers_source,
            "cuda_archs": list(self.cuda_archs),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Combination:
        cuda = read_cuda_build(data["cuda"], f"combination {data['id']!r}")
        source = data.get("xformers_source", "never")
        if source not in ("never", "always", "when-no-wheel-fits"):
            raise ValueError(f"combination {data['id']!r}: xformers_source {source!r}")
        return cls(
            id=data["id"],
            python=data["python"],
            cuda=cuda,
            torch=data["torch"],
            xformers=data.get("xformers"),
            platform=data["platform"],
            torch_index=data.get("torch_index", "default"),
            xformers_index=data.get("xformers_index", "default"),
            add_cuda_runtime=bool(data.get("add_cuda_runtime", False)),
            base_image=data.get("base_image"),
            runner=tuple(data.get("runner", ())),
            note=data.get("note", ""),
            xformers_source=source,
            cuda_archs=tuple(data.get("cuda_archs", ())),
        )


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """What ``xformers/cpp_lib.json`` says the binary was built with."""

    torch: str | None
    cuda: CudaTag | None  # written as its version, "12.8"
    arch_list: str | None  # TORCH_CUDA_ARCH_LIST, e.g. "8.0 9.0+PTX"

    def to_json(self) -> dict[str, Any]:
        return {"torch": self.torch, "cuda": _cuda_json(self.cuda), "arch_list": self.arch_list}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildRecord:
        return cls(torch=data["torch"], cuda=_cuda(data["cuda"]), arch_list=data["arch_list"])


@dataclass(frozen=True, kw_only=True)
class Requested:
    """The versions a combination asked for, kept beside the answer so that readers of
    ``resolution.json`` never parse them back out of the id (an unsatisfiable one has no
    resolved torch to read them from)."""

    torch: str
    xformers: str | None


@dataclass(frozen=True, kw_only=True)
class ResolvedTorch:
    version: str
    cuda: CudaTag | None  # written as its version, "12.1"; None for a CPU build
    cuda_source: CudaSource
    filename: str
    url: str
    sha256: str
    size: int | None = None
    index: str = "default"


@dataclass(frozen=True, kw_only=True)
class ResolvedXformers:
    version: str
    filename: str
    url: str
    sha256: str
    requires_torch: str  # the Requires-Dist specifier, e.g. "==2.5.1" or ">=2.10"
    built_with: BuildRecord
    size: int | None = None
    index: str = "default"


@dataclass(frozen=True, kw_only=True)
class SourceFile:
    """A file a source build reads: the sdist, or a wheel of its build group."""

    filename: str
    url: str
    sha256: str
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class SourceBuild:
    """How a combination's xformers is built from its sdist (``envbuilder build-wheel``).

    ``build_lock``/``build_requirements`` hold the build group (the sdist's build
    requirements and the CUDA compiler, headers and CCCL wheels), hash-pinned;
    ``key_inputs`` is what the build key is computed from, apart from the builder
    (an image digest or the host's toolchain), which only a build knows.
    """

    sdist: SourceFile
    why: str  # "no wheel fits: ..." or "xformers-source = 'always'"
    cuda: CudaTag  # the CUDA the compiler wheels are for, torch's (written as "13.0")
    arch_list: tuple[str, ...]
    flags: tuple[str, ...]  # fixed build environment, "NAME=value", sorted
    build_requirements_in: tuple[str, ...]  # what the build group was resolved from
    build_lock: str | None = None  # path of pylock.<id>-build.toml, like ``lock``
    build_lock_sha256: str | None = None
    build_requirements: str | None = None  # requirements.<id>.build.txt
    key_inputs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceBuild:
        return cls(
            sdist=SourceFile(**data["sdist"]),
            why=data.get("why", ""),
            cuda=CudaTag.from_version(data["cuda"]),
            arch_list=tuple(data.get("arch_list", ())),
            flags=tuple(data.get("flags", ())),
            build_requirements_in=tuple(data.get("build_requirements_in", ())),
            build_lock=data.get("build_lock"),
            build_lock_sha256=data.get("build_lock_sha256"),
            build_requirements=data.get("build_requirements"),
            key_inputs=dict(data.get("key_inputs") or {}),
        )


@dataclass(frozen=True, kw_only=True)
class Rejection:
    project: str
    filename: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ResolvedCombination:
    """The resolver's answer for one combination; the JSON of ``resolve --json``.

    It nests the matrix cell it answers (`combination`); ``id``, ``python``,
    ``platform``, ``cuda`` and ``requested`` are that cell's."""

    combination: Combination
    status: Status
    reason: str
    torch: ResolvedTorch | None = None
    xformers: ResolvedXformers | None = None
    extra_runtime: tuple[str, ...] = ()  # e.g. ("nvidia-cuda-runtime-cu12==12.8.90",)
    notes: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    lock: str | None = None  # path of pylock.<id>.toml, relative to the output's parent
    lock_sha256: str | None = None
    requirements: str | None = None
    #: the conformance suite's own dependencies (matrix.toml [suite]), locked beside ``lock``;
    #: None when the combination has no suite group
    suite_lock: str | None = None
    suite_requirements: str | None = None
    suite_lock_sha256: str | None = None
    #: xformers built from its sdist (then ``xformers`` describes the sdist, not a wheel)
    source_build: SourceBuild | None = None

    @property
    def id(self) -> str:
        return self.combination.id

    @property
    def python(self) -> str:
        return self.combination.python

    @property
    def platform(self) -> str:
        return self.combination.platform

    @property
    def cuda(self) -> str:
        """The cell's CUDA as ids spell it: ``cu121``, ``cpu`` or ``default``."""
        return str(self.combination.cuda)

    @property
    def requested(self) -> Requested | None:
        """The versions the cell asked for (an unsatisfiable answer has no resolved torch);
        None only for a resolution/1 answer that recorded them nowhere."""
        if not self.combination.torch:
            return None
        return Requested(torch=self.combination.torch, xformers=self.combination.xformers)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["combination"] = self.combination.to_json()
        if self.torch is not None:
            data["torch"]["cuda"] = _cuda_json(self.torch.cuda)
        if self.xformers is not None:
            data["xformers"]["built_with"] = self.xformers.built_with.to_json()
        if self.source_build is None:
            del data["source_build"]  # files of combinations without one stay as they were
        else:
            data["source_build"]["key_inputs"] = dict(data["source_build"]["key_inputs"])
            data["source_build"]["cuda"] = self.source_build.cuda.version
        return data

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], schema: str = RESOLUTION_SCHEMA
    ) -> ResolvedCombination:
        torch = data.get("torch")
        xf = data.get("xformers")
        if schema == RESOLUTION_SCHEMA:
            combination = Combination.from_json(data["combination"])
        else:
            combination = _cell_of_v1(data, torch)
        return cls(
            combination=combination,
            status=data["status"],
            reason=data.get("reason", ""),
            torch=ResolvedTorch(**{**torch, "cuda": _cuda(torch["cuda"])}) if torch else None,
            xformers=(
                ResolvedXformers(
                    **{k: v for k, v in xf.items() if k != "built_with"},
                    built_with=BuildRecord.from_json(xf["built_with"]),
                )
                if xf
                else None
            ),
            extra_runtime=tuple(data.get("extra_runtime", ())),
            notes=tuple(data.get("notes", ())),
            rejected=tuple(Rejection(**r) for r in data.get("rejected", ())),
            lock=data.get("lock"),
            lock_sha256=data.get("lock_sha256"),
            requirements=data.get("requirements"),
            suite_lock=data.get("suite_lock"),
            suite_requirements=data.get("suite_requirements"),
            suite_lock_sha256=data.get("suite_lock_sha256"),
            source_build=(
                SourceBuild.from_json(data["source_build"]) if data.get("source_build") else None
            ),
        )


def _cell_of_v1(data: Mapping[str, Any], torch: Mapping[str, Any] | None) -> Combination:
    """The matrix cell a resolution/1 answer names: its copied fields, the versions it asked
    for (``requested``, else the resolved torch's), the matrix defaults for the rest."""
    requested = data.get("requested")
    if requested is not None:
        versions = Requested(torch=requested["torch"], xformers=requested.get("xformers"))
    elif torch is not None:
        xf = data.get("xformers")
        public = str(torch["version"]).partition("+")[0]
        versions = Requested(torch=public, xformers=xf["version"] if xf else None)
    else:  # nothing names them: the cell's torch is unknown ("")
        versions = Requested(torch="", xformers=None)
    return Combination.from_json(
        {
            "id": data["id"],
            "python": data["python"],
            "cuda": data["cuda"],
            "platform": data["platform"],
            "torch": versions.torch,
            "xformers": versions.xformers,
            "add_cuda_runtime": bool(data.get("extra_runtime"))
            or str(data["id"]).endswith("-cudart"),
        }
    )


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The whole output of one ``envbuilder resolve`` run."""

    matrix: str
    matrix_sha256: str
    combinations: tuple[ResolvedCombination, ...] = field(default_factory=tuple)
    schema: str = RESOLUTION_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "matrix": self.matrix,
            "matrix_sha256": self.matrix_sha256,
            "combinations": [c.to_json() for c in self.combinations],
        }

    def by_id(self) -> dict[str, ResolvedCombination]:
        return {c.id: c for c in self.combinations}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Resolution:
        schema = data.get("schema")
        if schema not in READABLE_RESOLUTION_SCHEMAS:
            raise InputError(
                f"unsupported resolution schema {schema!r}; this envbuilder reads "
                f"{', '.join(READABLE_RESOLUTION_SCHEMAS)}: run `nox -s resolve` again"
            )
        combos: Sequence[Mapping[str, Any]] = data.get("combinations", [])
        return cls(
            matrix=data["matrix"],
            matrix_sha256=data["matrix_sha256"],
            combinations=tuple(ResolvedCombination.from_json(c, schema) for c in combos),
        )


def lock_filename(combination_id: str) -> str:
    """``pylock.<name>.toml`` for a combination: PEP 751 allows no dot in ``<name>``,
    so the id's dots become underscores (``pylock.py3_11-cu121-torch2_4_1-….toml``)."""
    return f"pylock.{combination_id.replace('.', '_')}.toml"


def requirements_filename(combination_id: str) -> str:
    """``requirements.<id>.txt``: a combination's lock for ``pip install --require-hashes``."""
    return f"requirements.{combination_id}.txt"


def results_filename(combination_id: str) -> str:
    """``<id>.json``: the conformance suite's results for a combination."""
    return f"{combination_id}.json"


def suite_lock_filename(combination_id: str) -> str:
    """The suite group's ``pylock.<name>-suite.toml``: ``<name>`` as in `lock_filename`,
    and ``-suite`` rather than ``.suite`` since PEP 751 allows no dot in it."""
    return f"pylock.{combination_id.replace('.', '_')}-suite.toml"


def build_lock_filename(combination_id: str) -> str:
    """A source build's build group: ``pylock.<name>-build.toml``, ``<name>`` as in
    `lock_filename` (``-build``, like ``-suite``: PEP 751 allows no dot in ``<name>``)."""
    return f"pylock.{combination_id.replace('.', '_')}-build.toml"


def legacy_build_lock_filename(combination_id: str) -> str:
    """The build group's name before it followed PEP 751 (``pylock.<name>.build.toml``):
    ``resolve`` renames such a file, ``build-wheel`` refuses it with how to rename."""
    return f"pylock.{combination_id.replace('.', '_')}.build.toml"


def suite_requirements_filename(combination_id: str) -> str:
    """``requirements.<id>.suite.txt``: the suite group for ``pip install --require-hashes``."""
    return f"requirements.{combination_id}.suite.txt"


def _cuda(version: str | None) -> CudaTag | None:
    """A CUDA written as its version (``"12.8"``), None as None."""
    return None if version is None else CudaTag.from_version(version)


def _cuda_json(cuda: CudaTag | None) -> str | None:
    return None if cuda is None else cuda.version


def image_tag(combination_id: str, lock_sha256: str) -> str:
    """``envbuilder/<id>:<first 12 of the lock's sha256>``: the image built from that lock."""
    if not _SHA256.match(lock_sha256):
        raise InputError(f"lock sha256 {lock_sha256!r} is not 64 lowercase hex digits")
    if not _REPO_COMPONENT.match(combination_id):
        raise InputError(
            f"combination id {combination_id!r} cannot name an image repository "
            "(lowercase letters, digits and single '.', '_' or '-' separators)"
        )
    return f"envbuilder/{combination_id}:{lock_sha256[:12]}"


def verified_lock(path: Path, sha256: str | None) -> str:
    """The sha256 of the lock at *path* (over its bytes), checked against the *sha256*
    ``resolution.json`` records for it (None: it records none, nothing to check).

    The one check that a lock is the one resolved: a lock edited or re-resolved since is
    refused with how to make them agree again."""
    import hashlib

    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError as e:
        raise InputError(f"{path}: lock not found; run `nox -s resolve`") from e
    except OSError as e:
        raise InputError(
            f"cannot read lock {str(path)!r} ({e.strerror}); run `nox -s resolve`"
        ) from e
    if sha256 is not None and digest != sha256:
        raise InputError(
            f"{path}: sha256 {digest!r} differs from {sha256!r} in the resolution; the lock "
            "changed after resolving, run `nox -s resolve` again"
        )
    return digest


def load_resolution(path: Path) -> Resolution:
    """Read ``resolution.json`` written by ``envbuilder resolve``."""
    from envbuilder.jsondoc import NotJSON, parse

    try:
        data = parse(path.read_bytes())
    except FileNotFoundError as e:
        raise InputError(f"{path}: not found; run `nox -s resolve` first") from e
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from e
    except NotJSON as e:
        raise InputError(f"{path}: {e}; run `nox -s resolve` again") from e
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a resolution file (the top level is not an object)")
    try:
        return Resolution.from_json(data)
    except InputError as e:
        raise InputError(f"{path}: {e}") from e
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise InputError(f"{path}: not a resolution file ({e!r})") from e
