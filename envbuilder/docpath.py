"""Names from documents, checked before they touch the file system.

A lockfile fetched from a URL, a build record, a results file or an index page can
name anything: a build key of ``../../victim`` or a wheel file name of ``../../x.whl``
joined into a cache path deletes or overwrites files outside the cache. Every path
component such a document supplies goes through `document_path`, which checks each
against the strict pattern of its kind and then that the joined path stays inside its
root; a refused name is an `UnsafeName` quoting the value and where it came from.

=========  ==================================================================
kind       accepted
=========  ==================================================================
``key``    a sha256 in lowercase hex (a build key, a content address)
``wheel``  a wheel's file name by the wheel-name grammar (PEP 427 and the
           binary distribution format spec), in the characters it allows
=========  ==================================================================
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from envbuilder.errors import InputError

__all__ = ["NameKind", "UnsafeName", "checked_name", "document_path"]

NameKind = Literal["key", "wheel"]

_KEY = re.compile(r"[0-9a-f]{64}")
#: name-version(-build)?-python-abi-platform.whl, each part in the characters the spec allows
_WHEEL = re.compile(
    r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?(-[A-Za-z0-9_.]+){3}\.whl"
)
_WHAT = {"key": "a sha256 in lowercase hex", "wheel": "a wheel's file name"}


class UnsafeName(InputError):
    """A name from a document that must not become part of a path."""


def checked_name(kind: NameKind, value: object, *, source: str) -> str:
    """*value* if it is a *kind* name (see the module's table), else `UnsafeName`."""
    if not isinstance(value, str) or not _fits(kind, value):
        raise UnsafeName(
            f"{source} names {value!r} where {_WHAT[kind]} belongs; refusing to use it in a "
            "path (nothing was read, written, downloaded or deleted for it)"
        )
    return value


def _fits(kind: NameKind, value: str) -> bool:
    if kind == "key":
        return _KEY.fullmatch(value) is not None
    if _WHEEL.fullmatch(value) is None or len(value.encode()) > 255:
        return False
    try:
        parse_wheel_filename(value)
    except InvalidWheelFilename:
        return False
    return True


def document_path(root: Path, *names: tuple[NameKind, object], source: str) -> Path:
    """*root* joined with each ``(kind, value)`` name, each checked by `checked_name`, and
    the joined path proven to lie inside *root* (symbolic links in it resolved)."""
    path = root
    for kind, value in names:
        path = path / checked_name(kind, value, source=source)
    base = os.path.realpath(root)
    joined = os.path.realpath(path)
    if os.path.commonpath([base, joined]) != base:
        raise UnsafeName(f"{source}: {path} leads outside {root} (to {joined}); refusing to use it")
    return path
