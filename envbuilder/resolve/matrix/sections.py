"""Load and validate ``matrix.toml``: its sections (defaults, indexes, axes, runners,
suite, exclude) and the checks across rows (ids, URL templates)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import string
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuilder.credentials import redact, split_credentials
from envbuilder.errors import ConfigError, InputError
from envbuilder.model import Combination, IndexSpec
from envbuilder.resolve.matrix.fields import (
    _AXES_KEYS,
    _DEFAULTS_KEYS,
    _ENV_VAR,
    _EXCLUDE_KEYS,
    _INDEX_KEYS,
    _RUNNER_KEYS,
    _STACK_PROJECTS,
    _SUITE_KEYS,
    _TOP_KEYS,
    _Fields,
    _toml_problem,
)
from envbuilder.resolve.matrix.records import (
    DEFAULT_RUNNER,
    Matrix,
    MatrixDefaults,
    Runners,
    Suite,
    _Row,
)
from envbuilder.resolve.matrix.rows import _platform_in_ids, _RowBuilder
from envbuilder.target import (
    CudaBuild,
    normalise_cuda,
)

__all__ = ["load_matrix", "parse_matrix"]


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


class _Loader(_Fields):
    """The field readers, and the sections made of them."""

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


def _glob_test(attr: str, patterns: Sequence[str]) -> Callable[[Combination], bool]:
    return lambda c: any(fnmatch.fnmatchcase(str(getattr(c, attr) or ""), p) for p in patterns)


def _describe(rule: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {rule[k]!r}" for k in _EXCLUDE_KEYS if k in rule)
