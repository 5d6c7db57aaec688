"""Which build of xformers is installed: the sha256 of its compiled libraries.

A wheel's ``RECORD`` lists every file with its sha256, and an installer copies those
entries into the installed ``*.dist-info/RECORD``. The hashes of the compiled libraries
(``xformers/_C.so``) therefore name the build that is installed, whether it came from an
index or from ``envbuilder build-wheel``, without reading the libraries themselves; the
lockfile compares them with a source build's record. Standard library only.
"""

from __future__ import annotations

import base64
import csv
import re
from importlib import metadata

__all__ = ["installed_libraries", "record_libraries"]

_LIBRARY = re.compile(r"\.(so|pyd|dylib)(\.[0-9.]+)?$")


def record_libraries(record: str) -> dict[str, str]:
    """The compiled libraries a ``RECORD`` lists, by path, with their sha256 (hex)."""
    found: dict[str, str] = {}
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not _LIBRARY.search(row[0]):
            continue
        algorithm, _, value = row[1].partition("=")
        if algorithm != "sha256" or not value:
            continue
        try:
            digest = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except ValueError:
            continue
        if len(digest) == 32:
            found[row[0]] = digest.hex()
    return dict(sorted(found.items()))


def installed_libraries(distribution: str = "xformers") -> dict[str, str] | None:
    """The installed *distribution*'s compiled libraries and their sha256; None when it is
    not installed or has no ``RECORD``."""
    try:
        record = metadata.distribution(distribution).read_text("RECORD")
    except metadata.PackageNotFoundError:
        return None
    return None if record is None else record_libraries(record)
