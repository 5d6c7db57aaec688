"""Reading ``matrix.toml``'s values: each reader checks one field's shape and records a
problem (where, what) instead of raising, so that loading reports every problem at once."""

from __future__ import annotations

import difflib
import re
import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from envbuilder.credentials import Credentials
from envbuilder.model import XformersSource
from envbuilder.target import (
    PLATFORM_TAG,
    PYTHON_VERSION,
    CudaBuild,
    parse_cuda_build,
    unsupported_platform,
)

__all__: list[str] = []  # read through the package

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


@dataclass
class _Fields:
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
