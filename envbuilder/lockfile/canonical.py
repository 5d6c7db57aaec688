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
from collections.abc import Mapping
from typing import Any

__all__ = [
    "HASH_KEY",
    "canonical_bytes",
    "content_sha256",
    "finite",
    "seal",
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
