"""Reading the lockfile: every reader checks the schema and ``content_sha256``.

Standard library only (``doctor`` runs inside arbitrary environments).
"""

from __future__ import annotations

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
from envbuilder.settings import Settings

__all__ = ["default_lockfile", "load_lockfile"]


def default_lockfile(settings: Settings | None = None) -> Path:
    """The lockfile the settings name (``$ENVBUILDER_LOCK``), else ``compat.lock.json`` here.

    Without ``settings`` the environment is read through `Settings`.
    """
    if settings is None:
        settings = Settings.from_environment(os.environ)
    return settings.lockfile or Path(DEFAULT_LOCKFILE)


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
        hint = (
            "it was written by a newer envbuilder: upgrade envbuilder"
            if isinstance(schema, str) and schema.startswith("envbuilder.compat/")
            else "this is not an envbuilder compatibility lockfile"
        )
        raise InputError(
            f"{path}: unsupported schema {schema!r} (expected {COMPAT_SCHEMA!r}); {hint}"
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
        return CompatLock.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: malformed lockfile ({e!r})") from e
