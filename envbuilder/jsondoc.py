"""Parsing the JSON documents envbuilder reads (resolution, results, lockfile) with a depth bound.

``json.loads`` recurses once per nesting level: ``[`` repeated 100000 times
raises `RecursionError`, and a document just under the interpreter's limit
parses but then overflows whatever walks it next (validation, canonical
serialisation). Every such document is therefore refused above a nesting depth
far beyond what envbuilder writes (a lockfile is about ten levels deep), with
one error type the readers turn into a message naming the file. Standard
library only (``doctor`` reads the lockfile in arbitrary environments).

``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259) though Python's
parser accepts them; envbuilder never writes them (``allow_nan=False``), and a
reader that took one in would fail later, far from the file, when it writes or
hashes the record. Integers beyond Python's digit limit (4300) raise a plain
``ValueError`` inside the parser, and a number such as ``1e999`` becomes
``inf``. All are refused here as `NotJSON`.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["LOCKFILE_DEPTH", "MAX_DEPTH", "NotJSON", "depth", "parse"]

#: Nesting allowed in a resolution or results file.
MAX_DEPTH = 64
#: A lockfile embeds results (each run's ``runner``) a few levels down, so it may be deeper.
LOCKFILE_DEPTH = 2 * MAX_DEPTH


class NotJSON(ValueError):
    """The bytes are not a JSON document envbuilder will read; ``str()`` says why."""


def depth(value: Any) -> int:
    """How deeply *value* nests (a scalar is 0, ``[]`` is 1), counted without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise NotJSON(f"not valid JSON ({name} is not a JSON number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON's syntax, but no double holds it
        raise NotJSON(f"not valid JSON ({text[:40]} overflows a double)")
    return value


def parse(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The document in *raw*, or `NotJSON` when it is not JSON or nests deeper than *max_depth*."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as e:
        raise NotJSON(f"JSON nested deeper than {max_depth} levels") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NotJSON(f"not valid JSON ({e})") from e
    except NotJSON:
        raise
    except ValueError as e:  # an integer past the interpreter's digit limit
        raise NotJSON(f"not valid JSON ({str(e).split(':')[0]})") from e
    if depth(data) > max_depth:
        raise NotJSON(f"JSON nested deeper than {max_depth} levels")
    return data
