"""Reading the lockfile: every reader checks the schema and ``content_sha256``.

Standard library only (``doctor`` runs inside arbitrary environments).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from envbuilder.errors import InputError
from envbuilder.jsondoc import LOCKFILE_DEPTH, NotJSON, parse
from envbuilder.lockfile.canonical import HASH_KEY, content_sha256
from envbuilder.lockfile.model import (
    COMPAT_SCHEMA,
    DEFAULT_LOCKFILE,
    READABLE_COMPAT_SCHEMAS,
    CompatLock,
)
from envbuilder.lockfile.recheck import rejudged, verdict_problems
from envbuilder.lockfile.shape import shape_problem
from envbuilder.settings import Settings

__all__ = ["default_lockfile", "load_lockfile"]

logger = logging.getLogger(__name__)


def default_lockfile(settings: Settings | None = None) -> Path:
    """The lockfile the settings name (``$ENVBUILDER_LOCK``), else ``compat.lock.json`` here.

    Without ``settings`` the environment is read through `Settings`.
    """
    if settings is None:
        settings = Settings.from_environment(os.environ)
    return settings.lockfile or Path(DEFAULT_LOCKFILE)


def _version(schema: str) -> int | None:
    """The major version of ``envbuilder.compat/N``; None for anything else."""
    prefix, _, number = schema.partition("/")
    return int(number) if prefix == "envbuilder.compat" and number.isdigit() else None


def _schema_hint(schema: object) -> str:
    """What to do about a lockfile schema this envbuilder does not read."""
    version = _version(schema) if isinstance(schema, str) else None
    if version is None:
        return "this is not an envbuilder compatibility lockfile"
    newest = _version(COMPAT_SCHEMA) or 0
    if version > newest:
        return "it was written by a newer envbuilder: upgrade envbuilder"
    return (
        "it was written by an older envbuilder, whose lockfiles this one no longer reads: "
        "regenerate it with `nox -s lock` (or download the current published lockfile)"
    )


def load_lockfile(path: Path) -> CompatLock:
    """Read and verify a compatibility lockfile; any problem is an `InputError` naming *path*."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise InputError(
            f"{path}: lockfile not found; run `nox -s lock` or pass --lock FILE"
        ) from e
    except OSError as e:
        raise InputError(f"{path}: cannot read the lockfile ({e.strerror})") from e
    try:
        data = parse(raw, max_depth=LOCKFILE_DEPTH)
    except NotJSON as e:
        raise InputError(
            f"{path}: {e}; the file is truncated or damaged: "
            "regenerate it with `nox -s lock` or download it again"
        ) from e
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a compatibility lockfile (top level is not an object)")
    schema = data.get("schema")
    if schema not in READABLE_COMPAT_SCHEMAS:
        raise InputError(
            f"{path}: unsupported schema {schema!r} (this envbuilder reads "
            f"{', '.join(repr(s) for s in READABLE_COMPAT_SCHEMAS)}); {_schema_hint(schema)}"
        )
    recorded = data.get(HASH_KEY)
    if not isinstance(recorded, str):
        raise InputError(f"{path}: no {HASH_KEY}; the lockfile is incomplete: regenerate it")
    actual = content_sha256(data)
    if actual != recorded:
        raise InputError(
            f"{path}: content_sha256 mismatch (recorded {recorded}, computed {actual}); the "
            "lockfile was edited or damaged: regenerate it with `nox -s lock`, never edit it by hand"
        )
    try:
        lock = CompatLock.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: malformed lockfile ({e!r})") from e
    wrong = shape_problem(lock)  # a resealed file can hold any value anywhere
    if wrong is not None:
        raise InputError(
            f"{path}: malformed lockfile: {wrong}; regenerate it with `nox -s lock`, never "
            "edit it by hand"
        )
    judged = rejudged(lock)  # what readers act on is what the checks say (recheck's docstring)
    # an older schema's verdicts were made by older rules: differing is expected, not news
    log = logger.warning if lock.schema == COMPAT_SCHEMA else logger.debug
    for problem in verdict_problems(lock, judged):
        log("%s: %s; the verdict its runs give is used", path, problem)
    return judged
