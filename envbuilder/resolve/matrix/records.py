"""The records a loaded ``matrix.toml`` is made of: the `Matrix`, its `MatrixDefaults`,
`Runners` and `Suite`, the combination ids, and a row before its id is checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from envbuilder.credentials import Credentials
from envbuilder.errors import ConfigError
from envbuilder.model import Combination, IndexSpec, XformersSource
from envbuilder.resolve.selectors import select
from envbuilder.target import (
    CudaBuild,
)

__all__ = ["DEFAULT_RUNNER", "Matrix", "MatrixDefaults", "Runners", "Suite", "combination_id"]

DEFAULT_RUNNER: tuple[str, ...] = ("self-hosted", "linux", "x64", "gpu")


def combination_id(
    *,
    python: str,
    cuda: CudaBuild,
    torch: str,
    xformers: str | None,
    add_cuda_runtime: bool,
    platform: str | None = None,
) -> str:
    """The id ``docs/contracts.md`` fixes: ``py3.11-cu121-torch2.4.1-xformers0.0.28.post1[-cudart]``;
    with ``platform`` (a matrix of rows for more than one platform), the platform tag follows
    the CUDA: ``py3.11-cu121-manylinux_2_28_aarch64-torch2.4.1-…``."""
    parts = [f"py{python}", str(cuda), *([platform] if platform else []), f"torch{torch}"]
    if xformers is not None:
        parts.append(f"xformers{xformers}")
    if add_cuda_runtime:
        parts.append("cudart")
    return "-".join(parts)


@dataclass(frozen=True, kw_only=True)
class MatrixDefaults:
    """``[defaults]``: what a row gets for a key it does not set."""

    platform: str = "manylinux_2_28_x86_64"
    base_image: str = "python:{python}-slim"
    add_cuda_runtime: bool = False
    index: str = "default"


@dataclass(frozen=True, kw_only=True)
class Runners:
    """``[runners]``: GitHub Actions runner labels, per CUDA variant, with a default.

    ``gpus`` names runner label sets for GPU models (``h100 = [...]``) that a
    workflow may fan each combination out over; empty means one job per combination.
    """

    default: tuple[str, ...] = DEFAULT_RUNNER
    cuda: Mapping[CudaBuild, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def labels_for(self, cuda: CudaBuild) -> tuple[str, ...]:
        return self.cuda.get(cuda, self.default)


@dataclass(frozen=True, kw_only=True)
class Suite:
    """``[suite]``: what the conformance suite imports beyond the combination (diffusers
    for the model and mask checks), as PEP 508 requirements in declared order.

    Each resolved combination gets them locked as a group of its own beside its lock,
    constrained to the versions its lock already has; none declared, no group."""

    requirements: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """A loaded, validated ``matrix.toml``."""

    path: Path
    sha256: str
    combinations: tuple[Combination, ...]
    indexes: Mapping[str, IndexSpec]
    runners: Runners
    defaults: MatrixDefaults
    suite: Suite = field(default_factory=Suite)
    #: index name -> environment variables its URL needs that were unset at load time
    unset_variables: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: user names and passwords taken out of the index URLs (never written anywhere)
    credentials: Credentials = field(default_factory=Credentials, compare=False)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.combinations)

    def by_id(self) -> dict[str, Combination]:
        return {c.id: c for c in self.combinations}

    def select(self, selectors: Sequence[str]) -> tuple[Combination, ...]:
        """The combinations the selectors pick (all for none), in matrix order."""
        return select(self.combinations, selectors)

    def require_index_urls(self, chosen: Sequence[Combination]) -> None:
        """Raise `ConfigError` when a chosen combination uses an index whose URL names an
        unset environment variable: for what fetches from the indexes (``resolve``), not
        for what only reads the matrix and the locks (``matrix``, ``build``, ``conformance``)."""
        problems: list[str] = []
        for name, variables in sorted(self.unset_variables.items()):
            users = [c.id for c in chosen if name in (c.torch_index, c.xformers_index)]
            if users:
                shown = ", ".join(users[:3]) + (
                    f" and {len(users) - 3} more" if len(users) > 3 else ""
                )
                problems.append(
                    f"indexes.{name}.url: environment variable(s) {', '.join(variables)} not set,"
                    f" and {shown} use(s) index {name!r} to fetch from; set it or select"
                    " other combinations"
                )
        if problems:
            raise ConfigError(str(self.path), problems)


@dataclass(frozen=True, kw_only=True)
class _Row:
    """One combination before ids are checked, with where it came from."""

    origin: str  # "pairs[0] (python 3.11, cuda cu121)"
    combination: Combination


@dataclass(frozen=True, kw_only=True)
class _RowKeys:
    """The keys a ``[[pairs]]`` entry and a ``[[combinations]]`` row share, checked and with
    the defaults filled in; its CUDA and Python make it a row."""

    torch: str
    xformers: str | None
    add_cuda_runtime: bool
    platform: str
    base_image: str  # a template: {python}, {cuda}, {torch}, {xformers}
    note: str
    xformers_source: XformersSource
    cuda_archs: tuple[str, ...] | None  # None: not set (a source build takes the runners')
    torch_index: str
    xformers_index: str
