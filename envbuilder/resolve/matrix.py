"""Load and validate ``matrix.toml`` into immutable `Combination` records.

The format is documented in ``docs/matrix.md``. Loading reads the file and the
environment (for ``${VAR}`` in index URLs) and writes nothing; every problem
in the file is reported at once in one `ConfigError`. An index URL whose
variable is unset is a problem only for what fetches from it
(`Matrix.require_index_urls`): selecting, planning jobs and building from
locks need no index URL.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import itertools
import os
import re
import string
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuilder.credentials import Credentials, redact, split_credentials
from envbuilder.errors import ConfigError, InputError
from envbuilder.lockfile.gpus import GPU_COMPUTE_CAPABILITY
from envbuilder.model import Combination, IndexSpec, XformersSource
from envbuilder.resolve.selectors import select
from envbuilder.target import (
    PLATFORM_TAG,
    PYTHON_VERSION,
    CudaBuild,
    normalise_cuda,
    parse_cuda_build,
    unsupported_platform,
)

__all__ = [
    "DEFAULT_RUNNER",
    "Matrix",
    "MatrixDefaults",
    "Runners",
    "Suite",
    "combination_id",
    "load_matrix",
    "parse_matrix",
]

DEFAULT_RUNNER: tuple[str, ...] = ("self-hosted", "linux", "x64", "gpu")
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TEMPLATE_FIELDS = frozenset({"python", "cuda", "torch", "xformers"})

_TOP_KEYS = (
    "defaults",
    "indexes",
    "axes",
    "pairs",
    "combinations",
    "exclude",
    "runners",
    "suite",
)
_SUITE_KEYS = ("requirements",)
#: the combination's own projects: the suite group is locked against them, never beside them
_STACK_PROJECTS = frozenset({"torch", "xformers"})
_DEFAULTS_KEYS = ("platform", "base-image", "add-cuda-runtime", "index")
_INDEX_KEYS = ("url", "projects", "kind")
_AXES_KEYS = ("python",)
_ROW_COMMON = (
    "cuda",
    "torch",
    "xformers",
    "index",
    "torch-index",
    "xformers-index",
    "add-cuda-runtime",
    "platform",
    "base-image",
    "note",
    "xformers-source",
    "cuda-archs",
)
_PAIR_KEYS = ("python", *_ROW_COMMON)
_COMBINATION_KEYS = ("python", *_ROW_COMMON)
_EXCLUDE_KEYS = ("python", "cuda", "torch", "xformers")
_RUNNER_KEYS = ("default", "cuda", "gpus")
_SOURCE_POLICIES: tuple[XformersSource, ...] = ("never", "always", "when-no-wheel-fits")
#: a TORCH_CUDA_ARCH_LIST entry: compute capability, an arch-specific "a"/"f", "+PTX"
_CUDA_ARCH = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?")


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


def load_matrix(path: Path, *, environ: Mapping[str, str] | None = None) -> Matrix:
    """Read and validate ``path``; raise `ConfigError` listing every problem found."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise InputError(
            f"{path}: not found; pass --matrix PATH or create matrix.toml (see docs/matrix.md)"
        ) from e
    return parse_matrix(data, path=path, environ=os.environ if environ is None else environ)


def parse_matrix(data: bytes, *, path: Path, environ: Mapping[str, str]) -> Matrix:
    """Validate the bytes of a ``matrix.toml``; pure apart from reading ``environ``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), [f"not UTF-8 text ({e.reason} at byte {e.start})"]) from e
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), [_toml_problem(path, e, text)]) from e
    except RecursionError as e:  # tomllib recurses once per nesting level
        raise ConfigError(str(path), ["not a TOML file (nested too deeply)"]) from e
    loader = _Loader(path=path, environ=environ)
    matrix = loader.load(document, sha256=hashlib.sha256(data).hexdigest())
    if loader.problems:
        raise ConfigError(str(path), loader.problems)
    assert matrix is not None
    return matrix


def _toml_problem(path: Path, error: tomllib.TOMLDecodeError, text: str) -> str:
    message = str(error)
    m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, flags=re.DOTALL)
    if m:
        return f"{path}:{m.group(2)}:{m.group(3)}: TOML syntax error: {m.group(1)}"
    m = re.fullmatch(r"(.*) \(at end of document\)", message, flags=re.DOTALL)
    if m:
        lines = max(1, len(text.splitlines()))
        return f"{path}:{lines}: TOML syntax error at end of file: {m.group(1)}"
    return f"{path}: TOML syntax error: {message}"


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


@dataclass
class _Loader:
    path: Path
    environ: Mapping[str, str]
    problems: list[str] = field(default_factory=list)
    credentials: Credentials = field(default_factory=Credentials)

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}" if where else message)

    # --- generic shape checks -------------------------------------------------

    def table(self, value: Any, where: str) -> dict[str, Any] | None:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(where, f"expected a table, got {_kind(value)} {value!r}")
            return None
        return value

    def tables(self, value: Any, where: str) -> list[dict[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(where, f"expected an array of tables ([[{where}]]), got {_kind(value)}")
            return []
        good: list[dict[str, Any]] = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                good.append(item)
            else:
                self.problem(f"{where}[{i}]", f"expected a table, got {_kind(item)} {item!r}")
                good.append({})
        return good

    def keys(self, table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
        for key in table:
            if key in allowed:
                continue
            hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            suggestion = (
                f"; did you mean {hint[0]!r}?" if hint else f"; allowed: {', '.join(allowed)}"
            )
            self.problem(_join(where, key), f"unknown key {key!r}{suggestion}")

    def string(self, value: Any, where: str) -> str | None:
        if isinstance(value, str):
            return value
        hint = ' (quote versions in TOML: "3.10", not 3.10)' if isinstance(value, float) else ""
        self.problem(where, f"expected a string, got {_kind(value)} {value!r}{hint}")
        return None

    def strings(self, value: Any, where: str) -> list[str] | None:
        """A string or an array of strings, as a list; None when it is neither."""
        located = self.located_strings(value, where)
        return None if located is None else [s for _, s in located]

    def located_strings(self, value: Any, where: str) -> list[tuple[str, str]] | None:
        """Like `strings`, each with its key path (``pairs[0].python[1]``) for messages."""
        if isinstance(value, str):
            return [(where, value)]
        if not isinstance(value, list):
            hint = " (quote versions in TOML)" if isinstance(value, float) else ""
            self.problem(
                where,
                f"expected a string or an array of strings, got {_kind(value)} {value!r}{hint}",
            )
            return None
        if not value:
            self.problem(where, "is empty; list at least one value or remove the key")
            return None
        # the items that are strings, so that they are checked too; the others are reported
        return [
            (f"{where}[{i}]", s)
            for i, item in enumerate(value)
            if (s := self.string(item, f"{where}[{i}]")) is not None
        ]

    def boolean(self, value: Any, where: str) -> bool | None:
        if isinstance(value, bool):
            return value
        self.problem(where, f"expected true or false, got {_kind(value)} {value!r}")
        return None

    # --- value checks ---------------------------------------------------------

    def python(self, value: str, where: str) -> str | None:
        if PYTHON_VERSION.fullmatch(value):
            return value
        self.problem(where, f"invalid Python version {value!r}; write it as '3.N', e.g. '3.11'")
        return None

    def cuda(self, value: str, where: str) -> CudaBuild | None:
        cuda = parse_cuda_build(value)
        if cuda is None:
            self.problem(
                where,
                f"invalid CUDA {value!r}; write 'cu121' or '12.1', 'cpu', or 'default'"
                " (whatever build the index has)",
            )
        return cuda

    def version(self, value: str, where: str) -> str | None:
        try:
            version = Version(value)
        except InvalidVersion:
            self.problem(where, f"invalid version {value!r} (not a PEP 440 version)")
            return None
        if version.local is not None:
            self.problem(
                where,
                f"version {value!r} has a local label; drop '+{version.local}' and set cuda instead",
            )
            return None
        return str(version)

    def platform(self, value: str, where: str) -> str | None:
        if PLATFORM_TAG.fullmatch(value):
            if (why := unsupported_platform(value)) is not None:
                self.problem(where, why)
                return None
            return value
        self.problem(
            where, f"invalid platform tag {value!r}; expected e.g. 'manylinux_2_28_x86_64'"
        )
        return None

    def template(self, value: str, where: str) -> str | None:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as e:
            self.problem(where, f"invalid template {value!r} ({e})")
            return None
        unknown = sorted(names - _TEMPLATE_FIELDS)
        if unknown:
            self.problem(
                where,
                f"unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)} in {value!r};"
                f" allowed: {', '.join('{' + n + '}' for n in sorted(_TEMPLATE_FIELDS))}",
            )
            return None
        return value

    # --- sections -------------------------------------------------------------

    def load(self, document: Mapping[str, Any], *, sha256: str) -> Matrix | None:
        self.keys(document, _TOP_KEYS, "")
        defaults = self.defaults(document.get("defaults"))
        indexes, unset = self.indexes(document.get("indexes"))
        pythons = self.axes(document.get("axes"))
        runners = self.runners(document.get("runners"))
        suite = self.suite(document.get("suite"))
        if defaults is not None and defaults.index not in indexes:
            _RowBuilder(self, defaults, indexes, runners).known_index(
                defaults.index, "defaults.index"
            )
        build = _RowBuilder(self, defaults, indexes, runners)

        expanded: list[_Row] = []
        for i, pair in enumerate(self.tables(document.get("pairs"), "pairs")):
            expanded += build.pair(pair, f"pairs[{i}]", pythons)
        expanded = self.apply_excludes(document.get("exclude"), expanded)
        explicit: list[_Row] = []
        for i, row in enumerate(self.tables(document.get("combinations"), "combinations")):
            explicit += build.explicit(row, f"combinations[{i}]")
        rows = _platform_in_ids(expanded + explicit)
        self.check_ids(rows)
        self.check_templates(rows, indexes)
        if not rows and not self.problems:
            self.problem("", "declares no combinations; add [[pairs]] or [[combinations]]")
        if self.problems or defaults is None:
            return None
        return Matrix(
            path=self.path,
            sha256=sha256,
            combinations=tuple(r.combination for r in rows),
            indexes=MappingProxyType(indexes),
            runners=runners,
            defaults=defaults,
            suite=suite,
            unset_variables=MappingProxyType(unset),
            credentials=self.credentials,
        )

    def defaults(self, value: Any) -> MatrixDefaults | None:
        table = self.table(value, "defaults")
        if table is None:
            return None
        self.keys(table, _DEFAULTS_KEYS, "defaults")
        base = MatrixDefaults()
        platform, image, cudart, index = (
            base.platform,
            base.base_image,
            base.add_cuda_runtime,
            base.index,
        )
        if "platform" in table and (s := self.string(table["platform"], "defaults.platform")):
            platform = self.platform(s, "defaults.platform") or platform
        if "base-image" in table and (s := self.string(table["base-image"], "defaults.base-image")):
            image = self.template(s, "defaults.base-image") or image
        if "add-cuda-runtime" in table:
            b = self.boolean(table["add-cuda-runtime"], "defaults.add-cuda-runtime")
            cudart = cudart if b is None else b
        if "index" in table and (s := self.string(table["index"], "defaults.index")):
            index = s  # checked against [indexes] with the rows
        return MatrixDefaults(
            platform=platform, base_image=image, add_cuda_runtime=cudart, index=index
        )

    def indexes(self, value: Any) -> tuple[dict[str, IndexSpec], dict[str, tuple[str, ...]]]:
        indexes: dict[str, IndexSpec] = {"default": IndexSpec(name="default", url=None)}
        unset: dict[str, tuple[str, ...]] = {}
        table = self.table(value, "indexes")
        for name, spec in (table or {}).items():
            where = f"indexes.{name}"
            body = self.table(spec, where)
            if body is None:
                continue
            self.keys(body, _INDEX_KEYS, where)
            url: str | None = None
            if "url" in body:
                url = self.string(body["url"], f"{where}.url")
                if url is not None:
                    url, missing = self.index_url(url, f"{where}.url")
                    if missing:
                        unset[name] = missing
            elif name != "default":
                self.problem(where, "has no url; only the 'default' index may omit it")
            projects: tuple[str, ...] = ()
            if "projects" in body:
                names = self.strings(body["projects"], f"{where}.projects")
                projects = tuple(sorted({canonicalize_name(n) for n in names or ()}))
            kind: Literal["simple", "find-links"] = "simple"
            if "kind" in body and (k := self.string(body["kind"], f"{where}.kind")) is not None:
                if k == "find-links":
                    kind = "find-links"
                elif k != "simple":
                    self.problem(
                        f"{where}.kind", f"unknown kind {k!r}; use 'simple' or 'find-links'"
                    )
            indexes[name] = IndexSpec(name=name, url=url, projects=projects, kind=kind)
        return indexes, unset

    def index_url(self, raw: str, where: str) -> tuple[str | None, tuple[str, ...]]:
        """Expand ``${VAR}``; an unset variable is reported only if a selected row uses the index.

        A user name and password in the URL (typed in or expanded) are taken out into
        `credentials`: the URL the matrix keeps, and every output shows, carries none."""
        # Empty counts as unset: CI systems give an unset variable as "" (GitHub's `vars.X`).
        missing = tuple(dict.fromkeys(v for v in _ENV_VAR.findall(raw) if not self.environ.get(v)))
        expanded = _ENV_VAR.sub(lambda m: self.environ.get(m.group(1), m.group(0)), raw)
        expanded, found = split_credentials(expanded)
        self.credentials = self.credentials.merged(found)
        raw = redact(raw)
        try:
            names = {n for _, n, _, _ in string.Formatter().parse(_ENV_VAR.sub("", expanded)) if n}
        except ValueError as e:
            self.problem(where, f"invalid URL template {raw!r} ({e})")
            return None, ()
        if names - {"cuda"}:
            self.problem(
                where,
                f"unknown placeholder(s) {', '.join(sorted(names - {'cuda'}))} in {raw!r};"
                " only {cuda} is allowed (and ${VAR} for environment variables)",
            )
            return None, ()
        if not missing and not re.match(r"(https?|file)://", expanded):
            self.problem(
                where, f"URL {redact(expanded)!r} must start with http://, https:// or file://"
            )
            return None, ()
        return expanded, missing

    def suite(self, value: Any) -> Suite:
        """``[suite] requirements``: PEP 508 requirements on an index, none of them the
        combination's own projects, each project once or each time with a marker."""
        table = self.table(value, "suite") or {}
        self.keys(table, _SUITE_KEYS, "suite")
        if "requirements" not in table:
            return Suite()
        where = "suite.requirements"
        value = table["requirements"]
        if value == []:
            return Suite()  # said explicitly: no suite group
        requirements: list[str] = []
        seen: dict[str, tuple[str, Marker | None]] = {}
        for at, text in self.located_strings(value, where) or []:
            try:
                req = Requirement(text)
            except InvalidRequirement as e:
                self.problem(at, f"invalid requirement {text!r} ({e})")
                continue
            name = canonicalize_name(req.name)
            if req.url:
                self.problem(
                    at,
                    f"{text!r} is a direct reference; the suite group is locked from the"
                    f" indexes: name a version instead (e.g. '{req.name}==1.2.3')",
                )
            elif name in _STACK_PROJECTS:
                self.problem(
                    at,
                    f"{text!r} names {name}, which each combination pins itself;"
                    " the suite group is locked against it: remove it",
                )
            elif name in seen and (req.marker is None or seen[name][1] is None):
                self.problem(
                    at,
                    f"{text!r} names {name} again (after {seen[name][0]!r}); to pick a release"
                    " per Python, give each a marker (e.g. \"; python_version < '3.11'\")",
                )
            else:
                seen.setdefault(name, (text, req.marker))
                requirements.append(str(req))
        return Suite(requirements=tuple(requirements))

    def axes(self, value: Any) -> list[str] | None:
        """The python axis; None when undeclared (pairs must then list their own)."""
        table = self.table(value, "axes") or {}
        self.keys(table, _AXES_KEYS, "axes")
        if "python" not in table:
            return None
        values = self.located_strings(table["python"], "axes.python") or []
        pythons = [p for at, v in values if (p := self.python(v, at))]
        for dup in sorted({p for p in pythons if pythons.count(p) > 1}):
            self.problem("axes.python", f"lists {dup!r} more than once")
        return list(dict.fromkeys(pythons))

    def runners(self, value: Any) -> Runners:
        table = self.table(value, "runners") or {}
        self.keys(table, _RUNNER_KEYS, "runners")
        default = DEFAULT_RUNNER
        if "default" in table:
            default = tuple(self.strings(table["default"], "runners.default") or default)
        by_cuda: dict[CudaBuild, tuple[str, ...]] = {}
        for key, labels in (self.table(table.get("cuda"), "runners.cuda") or {}).items():
            where = f"runners.cuda.{key}"
            cuda = self.cuda(key, where)
            got = self.strings(labels, where)
            if cuda is not None and got is not None:
                by_cuda[cuda] = tuple(got)
        gpus: dict[str, tuple[str, ...]] = {}
        for key, labels in (self.table(table.get("gpus"), "runners.gpus") or {}).items():
            got = self.strings(labels, f"runners.gpus.{key}")
            if got is not None:
                gpus[key] = tuple(got)
        return Runners(default=default, cuda=MappingProxyType(by_cuda), gpus=MappingProxyType(gpus))

    def apply_excludes(self, value: Any, rows: list[_Row]) -> list[_Row]:
        """Remove expanded pair rows matching any ``[[exclude]]`` rule; a rule matching nothing is a problem."""
        kept = rows
        for i, rule in enumerate(self.tables(value, "exclude")):
            where = f"exclude[{i}]"
            self.keys(rule, _EXCLUDE_KEYS, where)
            tests: list[Callable[[Combination], bool]] = []
            for key in _EXCLUDE_KEYS:
                if key not in rule:
                    continue
                patterns = self.strings(rule[key], f"{where}.{key}")
                if patterns is None:
                    continue
                if key == "cuda":
                    patterns = [normalise_cuda(p) or p for p in patterns]
                tests.append(_glob_test(key, patterns))
            if not any(k in rule for k in _EXCLUDE_KEYS):
                self.problem(where, f"has no rule; set any of {', '.join(_EXCLUDE_KEYS)}")
                continue
            if not tests:
                continue
            matched = [r for r in kept if all(t(r.combination) for t in tests)]
            if not matched:
                self.problem(
                    where,
                    f"matches no combination expanded from [[pairs]] ({_describe(rule)});"
                    " fix the rule or remove it",
                )
            kept = [r for r in kept if r not in matched]
        return kept

    def check_ids(self, rows: Iterable[_Row]) -> None:
        seen: dict[str, str] = {}
        for row in rows:
            cid = row.combination.id
            if cid in seen:
                self.problem(
                    "", f"duplicate combination id {cid!r}: {seen[cid]} and {row.origin} collide"
                )
            else:
                seen[cid] = row.origin

    def check_templates(self, rows: Iterable[_Row], indexes: Mapping[str, IndexSpec]) -> None:
        for row in rows:
            c = row.combination
            if c.cuda != "default":
                continue
            for name in dict.fromkeys((c.torch_index, c.xformers_index)):
                spec = indexes.get(name)
                if spec is not None and spec.per_cuda:
                    self.problem(
                        row.origin,
                        f"uses index {name!r}, whose URL has {{cuda}}, with cuda = 'default';"
                        " set a CUDA (e.g. 'cu121') or use an index without {cuda}",
                    )


@dataclass
class _RowBuilder:
    """Turns ``[[pairs]]`` and ``[[combinations]]`` tables into rows, checking each key."""

    loader: _Loader
    defaults: MatrixDefaults | None
    indexes: Mapping[str, IndexSpec]
    runners: Runners

    def pair(self, table: Mapping[str, Any], where: str, axis: list[str] | None) -> list[_Row]:
        ld = self.loader
        ld.keys(table, _PAIR_KEYS, where)
        pythons = axis or []
        subset = pythons
        if "python" in table:
            values = ld.located_strings(table["python"], f"{where}.python") or []
            subset = []
            for at, v in values:
                p = ld.python(v, at)
                if p is None:
                    continue
                if p not in pythons:
                    ld.problem(
                        at,
                        f"{p!r} is not in axes.python {pythons!r}; add it there or drop it here",
                    )
                subset.append(p)
        elif axis is None:
            ld.problem(where, "no Python to expand over; set axes.python or python in this pair")
        cudas: list[CudaBuild] = []
        for at, v in ld.located_strings(table.get("cuda", "default"), f"{where}.cuda") or []:
            c = ld.cuda(v, at)
            if c is not None:
                cudas.append(c)
        common = self.common(table, where)
        if common is None:
            return []
        return [
            self.row(
                common, python=p, cuda=c, origin=f"{where} (python {p}, cuda {c})", where=where
            )
            for c, p in itertools.product(cudas, subset)
        ]

    def explicit(self, table: Mapping[str, Any], where: str) -> list[_Row]:
        ld = self.loader
        ld.keys(table, _COMBINATION_KEYS, where)
        python = None
        if "python" not in table:
            ld.problem(where, "missing key 'python'")
        elif (s := ld.string(table["python"], f"{where}.python")) is not None:
            python = ld.python(s, f"{where}.python")
        cuda = None
        if (s := ld.string(table.get("cuda", "default"), f"{where}.cuda")) is not None:
            cuda = ld.cuda(s, f"{where}.cuda")
        common = self.common(table, where)
        if common is None or python is None or cuda is None:
            return []
        return [self.row(common, python=python, cuda=cuda, origin=where, where=where)]

    def common(self, table: Mapping[str, Any], where: str) -> _RowKeys | None:
        """The keys a pair and an explicit row share; None when any is invalid."""
        ld = self.loader
        before = len(ld.problems)
        d = self.defaults or MatrixDefaults()
        torch: str | None = None
        if "torch" not in table:
            ld.problem(where, "missing key 'torch'")
        elif (s := ld.string(table["torch"], f"{where}.torch")) is not None:
            torch = ld.version(s, f"{where}.torch")
        xformers = None
        if "xformers" in table and (s := ld.string(table["xformers"], f"{where}.xformers")):
            xformers = ld.version(s, f"{where}.xformers")
        add_cuda_runtime = d.add_cuda_runtime
        if "add-cuda-runtime" in table:
            b = ld.boolean(table["add-cuda-runtime"], f"{where}.add-cuda-runtime")
            add_cuda_runtime = d.add_cuda_runtime if b is None else b
        platform: str | None = d.platform
        if "platform" in table and (s := ld.string(table["platform"], f"{where}.platform")):
            platform = ld.platform(s, f"{where}.platform")
        base_image: str | None = d.base_image
        if "base-image" in table and (s := ld.string(table["base-image"], f"{where}.base-image")):
            base_image = ld.template(s, f"{where}.base-image")
        note = ""
        if "note" in table and (s := ld.string(table["note"], f"{where}.note")) is not None:
            note = s
        xformers_source: XformersSource = "never"
        if "xformers-source" in table:
            xformers_source = self.source_policy(table["xformers-source"], where)
        cuda_archs = None
        if "cuda-archs" in table:
            cuda_archs = self.cuda_archs(table["cuda-archs"], f"{where}.cuda-archs")
        index = d.index
        if "index" in table and (s := ld.string(table["index"], f"{where}.index")) is not None:
            index = s
        # an unknown defaults.index is reported once, by the loader
        known = (
            index in self.indexes
            if "index" not in table
            else self.known_index(index, f"{where}.index")
        )
        chosen = {"torch": "default", "xformers": "default"}
        if known:
            chosen = {p: self.serving(index, p) for p in chosen}
        for project in ("torch", "xformers"):
            key = f"{project}-index"
            s = ld.string(table[key], f"{where}.{key}") if key in table else None
            if s is not None and self.known_index(s, f"{where}.{key}"):
                chosen[project] = s
                spec = self.indexes[s]
                if spec.projects and project not in spec.projects:
                    ld.problem(
                        f"{where}.{key}",
                        f"index {s!r} serves only {', '.join(spec.projects)}, not {project!r}",
                    )
        if len(ld.problems) > before or torch is None or platform is None or base_image is None:
            return None
        return _RowKeys(
            torch=torch,
            xformers=xformers,
            add_cuda_runtime=add_cuda_runtime,
            platform=platform,
            base_image=base_image,
            note=note,
            xformers_source=xformers_source,
            cuda_archs=cuda_archs,
            torch_index=chosen["torch"],
            xformers_index=chosen["xformers"],
        )

    def source_policy(self, value: Any, where: str) -> XformersSource:
        """``xformers-source``: true (always), false (never) or a policy by name."""
        at = f"{where}.xformers-source"
        if isinstance(value, bool):
            return "always" if value else "never"
        if isinstance(value, str) and value in _SOURCE_POLICIES:
            return value
        hint = difflib.get_close_matches(str(value), _SOURCE_POLICIES, n=1, cutoff=0.6)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        self.loader.problem(
            at,
            f"expected true, false or one of {', '.join(map(repr, _SOURCE_POLICIES))}, "
            f"got {_kind(value)} {value!r}{suggestion}",
        )
        return "never"

    def cuda_archs(self, value: Any, where: str) -> tuple[str, ...] | None:
        """``cuda-archs``: compute capabilities ("9.0", "10.0+PTX") or GPU names ("H200")."""
        located = self.loader.located_strings(value, where)
        if located is None:
            return None
        archs: set[str] = set()
        bad = False
        for at, text in located:
            arch = _cuda_arch(text)
            if arch is None:
                known = ", ".join(sorted(GPU_COMPUTE_CAPABILITY))
                self.loader.problem(
                    at,
                    f"invalid CUDA architecture {text!r}; write a compute capability as "
                    f"TORCH_CUDA_ARCH_LIST does ('9.0', '8.6+PTX', '10.0a') or a GPU ({known})",
                )
                bad = True
            else:
                archs.add(arch)
        return None if bad else tuple(sorted(archs, key=_arch_key))

    def source_build(self, common: _RowKeys, cuda: CudaBuild, where: str) -> tuple[str, ...]:
        """Check a row's source-build keys; its architectures (from the matrix's GPUs
        when the row names none)."""
        ld = self.loader
        policy = common.xformers_source
        archs = common.cuda_archs
        if policy == "never":
            if archs is not None:
                ld.problem(
                    f"{where}.cuda-archs",
                    "is only used by a source build; set xformers-source too, or remove it",
                )
            return ()
        if common.xformers is None:
            ld.problem(
                f"{where}.xformers-source",
                "the row has no xformers to build; set xformers or remove xformers-source",
            )
        if common.add_cuda_runtime:
            ld.problem(
                f"{where}.xformers-source",
                "with add-cuda-runtime = true: a source build is made for torch's own CUDA and "
                "needs no other runtime; choose one of the two",
            )
        if cuda == "cpu":
            ld.problem(
                f"{where}.xformers-source",
                "with cuda = 'cpu': xformers is built from source for a CUDA torch; "
                "set a CUDA (e.g. 'cu130') or remove xformers-source",
            )
        if archs is not None:
            return archs
        found = self.gpu_archs(cuda)
        if not found:
            ld.problem(
                f"{where}.cuda-archs",
                "a source build needs the CUDA architectures to compile for, and the matrix "
                "names no GPU ([runners.gpus] or a runner label such as 'h100'); "
                "set cuda-archs, e.g. ['9.0']",
            )
        return found

    def gpu_archs(self, cuda: CudaBuild) -> tuple[str, ...]:
        """The compute capabilities of the GPUs the matrix's runners name for ``cuda``."""
        names = [*self.runners.gpus, *self.runners.labels_for(cuda)]
        for labels in self.runners.gpus.values():
            names += labels
        archs = {
            GPU_COMPUTE_CAPABILITY[key]
            for name in names
            if (key := re.sub(r"[\s_-]", "", name).upper()) in GPU_COMPUTE_CAPABILITY
        }
        return tuple(sorted(archs, key=_arch_key))

    def known_index(self, name: str, where: str) -> bool:
        if name in self.indexes:
            return True
        names = sorted(self.indexes)
        hint = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        suggestion = f"did you mean {hint[0]!r}?" if hint else f"declared: {', '.join(names)}"
        self.loader.problem(where, f"unknown index {name!r}; {suggestion}")
        return False

    def serving(self, name: str, project: str) -> str:
        """``index = X`` means X for each project X serves, the default index for the rest."""
        spec = self.indexes[name]
        return name if not spec.projects or project in spec.projects else "default"

    def row(
        self, common: _RowKeys, *, python: str, cuda: CudaBuild, origin: str, where: str
    ) -> _Row:
        if cuda == "cpu" and common.add_cuda_runtime:
            self.loader.problem(
                where,
                "cuda = 'cpu' with add-cuda-runtime = true: a CPU build has no CUDA runtime to add",
            )
        archs = self.source_build(common, cuda, where)
        cid = combination_id(
            python=python,
            cuda=cuda,
            torch=common.torch,
            xformers=common.xformers,
            add_cuda_runtime=common.add_cuda_runtime,
        )
        fields = {
            "python": python,
            "cuda": cuda,
            "torch": common.torch,
            "xformers": common.xformers or "",
        }
        combination = Combination(
            id=cid,
            python=python,
            cuda=cuda,
            torch=common.torch,
            xformers=common.xformers,
            platform=common.platform,
            torch_index=common.torch_index,
            xformers_index=common.xformers_index,
            add_cuda_runtime=common.add_cuda_runtime,
            base_image=common.base_image.format_map(fields),
            runner=self.runners.labels_for(cuda),
            note=common.note,
            xformers_source=common.xformers_source,
            cuda_archs=archs,
        )
        return _Row(origin=origin, combination=combination)


def _cuda_arch(text: str) -> str | None:
    """A ``cuda-archs`` entry in TORCH_CUDA_ARCH_LIST's spelling, or None."""
    stripped = text.strip()
    if m := _CUDA_ARCH.fullmatch(stripped):
        return f"{int(m.group(1))}.{m.group(2)}{m.group(3)}{m.group(4) or ''}"
    key = re.sub(r"[\s_-]", "", stripped).upper()
    return GPU_COMPUTE_CAPABILITY.get(key)


def _arch_key(arch: str) -> tuple[int, int, str]:
    major, _, rest = arch.partition(".")
    return (int(major), int(rest[0]), rest[1:])


def _platform_in_ids(rows: list[_Row]) -> list[_Row]:
    """*rows*, with the platform in every id when they are for more than one platform: the
    versions alone cannot tell an x86_64 row from an aarch64 one."""
    if len({r.combination.platform for r in rows}) < 2:
        return rows
    return [
        _Row(
            origin=r.origin,
            combination=replace(
                r.combination,
                id=combination_id(
                    python=r.combination.python,
                    cuda=r.combination.cuda,
                    torch=r.combination.torch,
                    xformers=r.combination.xformers,
                    add_cuda_runtime=r.combination.add_cuda_runtime,
                    platform=r.combination.platform,
                ),
            ),
        )
        for r in rows
    ]


def _glob_test(attr: str, patterns: Sequence[str]) -> Callable[[Combination], bool]:
    return lambda c: any(fnmatch.fnmatchcase(str(getattr(c, attr) or ""), p) for p in patterns)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    names = {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }
    return names.get(type(value), type(value).__name__)


def _describe(rule: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {rule[k]!r}" for k in _EXCLUDE_KEYS if k in rule)
