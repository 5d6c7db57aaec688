"""Canonical JSON, the content hash, and atomic writes.

Canonical form: keys sorted, two-space indent, ``", "``/``": "`` separators,
non-ASCII kept as UTF-8, one trailing newline. The same document therefore
always serialises to the same bytes, which is what makes ``envbuilder lock``
reproducible and lets every reader recompute ``content_sha256``: the sha256 of
the canonical bytes of the document *without* that key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "HASH_KEY",
    "canonical_bytes",
    "content_sha256",
    "finite",
    "seal",
    "sha256_file",
    "write_atomic",
]

HASH_KEY = "content_sha256"


def canonical_bytes(document: Any) -> bytes:
    """Serialise *document* in the canonical form (raises ValueError on NaN/inf)."""
    text = json.dumps(
        document,
        sort_keys=True,
        indent=2,
        separators=(",", ": "),
        ensure_ascii=False,
        allow_nan=False,
    )
    return (text + "\n").encode("utf-8")


def content_sha256(document: Mapping[str, Any]) -> str:
    """The hash a sealed document carries: over everything except ``content_sha256``."""
    unsealed = {k: v for k, v in document.items() if k != HASH_KEY}
    return hashlib.sha256(canonical_bytes(unsealed)).hexdigest()


def seal(document: Mapping[str, Any]) -> bytes:
    """Add ``content_sha256`` to *document* and return its canonical bytes."""
    sealed = {k: v for k, v in document.items() if k != HASH_KEY}
    sealed[HASH_KEY] = content_sha256(sealed)
    return canonical_bytes(sealed)


def finite(value: Any) -> Any:
    """Replace non-finite floats (which JSON cannot carry) by their names, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write *data* to *path* through a temporary file in the same directory and
    ``os.replace``: readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
