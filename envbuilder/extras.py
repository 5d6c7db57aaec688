"""The optional dependencies, the extra that brings each, and what each command needs.

The base install (``pip install gpu-envbuilder``) carries what the consumer
commands need: ``query``, ``export``, ``doctor`` and ``install --installer pip``.
The rest comes with an extra:

=========  ===============================  ====================================
extra      brings                           for
=========  ===============================  ====================================
resolve    uv, rich, jsonschema             resolve, matrix, lock, publish
install    uv                               install (default installer, --venv)
docker     the Docker SDK                   build, conformance in a container
verify     sigstore                         verify, install --verify
all        all of the above                 the maintainers' pipeline (nox)
=========  ===============================  ====================================

A command whose extra is missing stops before it starts, with the extra to
install (`check_command`), and a module imported deep inside one goes through
`require`, so the message is the same wherever the gap is found.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from envbuilder.errors import MissingToolError

__all__ = ["COMMAND_NEEDS", "Need", "check_command", "missing", "require"]

DISTRIBUTION = "gpu-envbuilder"


@dataclass(frozen=True, kw_only=True)
class Need:
    """A module a command imports, the extra that installs it, and when it is not needed."""

    module: str
    extra: str
    #: the command needs it unless this argument is true (e.g. conformance --in-place)
    unless: str | None = None


#: command -> what it imports beyond the base dependencies
COMMAND_NEEDS: dict[str, tuple[Need, ...]] = {
    # uv is found on PATH too (resolve.closure.find_uv), so only its absence everywhere stops resolve
    "resolve": (Need(module="rich", extra="resolve"),),
    "matrix": (),
    "build": (Need(module="docker", extra="docker"),),
    "build-wheel": (Need(module="docker", extra="docker", unless="in_place"),),
    "conformance": (Need(module="docker", extra="docker", unless="in_place"),),
    "lock": (Need(module="jsonschema", extra="resolve"),),
    "publish": (),
    "snapshot": (),
    "query": (),
    "export": (),
    "install": (),  # uv only for --installer uv, found on PATH too: see consumer.install
    "doctor": (),
    "verify": (Need(module="sigstore", extra="verify"),),
    "repro": (),  # reads check records; the script it writes needs torch, not envbuilder
    "report": (),
}


def missing(module: str, *, extra: str, needed_for: str) -> MissingToolError:
    """The error for an absent optional module, naming the extra that installs it."""
    return MissingToolError(
        f"{needed_for} needs the Python package {module!r}, which is not installed here; "
        f"install envbuilder with the {extra!r} extra: "
        f"`pip install '{DISTRIBUTION}[{extra}]'` "
        f"(or `uv tool install '{DISTRIBUTION}[{extra}]'`, or `[all]` for every extra)"
    )


def require(module: str, *, extra: str, needed_for: str) -> ModuleType:
    """Import ``module``, or raise `MissingToolError` naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but one of its own imports is broken: show that
        raise missing(module, extra=extra, needed_for=needed_for) from e


def _installed(module: str) -> bool:
    """Importable as a real module: a directory of that name in the working directory (the
    checkout has ``docker/``) is only a namespace package, with no origin."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def check_command(command: str, args: object) -> None:
    """Stop ``command`` before it starts when an extra it needs for ``args`` is missing."""
    for need in COMMAND_NEEDS.get(command, ()):
        if need.unless is not None and getattr(args, need.unless, False):
            continue
        if not _installed(need.module):
            raise missing(need.module, extra=need.extra, needed_for=f"envbuilder {command}")
