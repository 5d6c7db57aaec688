"""Whether a lockfile's records hold the types their annotations say.

The records' ``from_json`` take what a document gives: a lockfile edited and resealed
(its content hash proves integrity, not authorship) can put an object where a GPU name
belongs, or a number where a path does, and the first reader to use the value fails far
from the file with a traceback. `shape_problem` walks the records a document was read into
and names the first field whose value is not of its annotated type, so that readers refuse
the file in one line instead. The annotations are the one statement of the types: nothing
is restated here. Standard library only (``doctor`` reads lockfiles in other environments).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

__all__ = ["shape_problem"]


_Found = tuple[str, object, Any]  # the path below the value checked, the value, its type
_Check = Callable[[object], _Found | None]


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "a list"
    if origin is Mapping or dataclasses.is_dataclass(hint):
        return "an object"
    if hint is type(None):
        return "null"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        hint, str(hint)
    )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _below(part: str, found: _Found | None) -> _Found | None:
    return None if found is None else (part + found[0], found[1], found[2])


def _scalar(hint: Any) -> _Check:
    if hint is bool:
        return lambda v: None if isinstance(v, bool) else ("", v, hint)
    if hint is int:
        return lambda v: None if type(v) is int else ("", v, hint)
    if hint is float:
        return lambda v: None if type(v) in (int, float) else ("", v, hint)
    if hint is type(None):
        return lambda v: None if v is None else ("", v, hint)
    if hint is str:
        return lambda v: None if isinstance(v, str) else ("", v, hint)
    raise TypeError(f"no check for a field of type {hint!r}")


@cache
def _check(hint: Any) -> _Check:
    """How a value of type *hint* is checked (made once per type)."""
    if hint is Any:
        return lambda v: None
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        record: type = hint  # its fields are looked up when walked: records nest themselves
        return lambda v: _walk(v, _fields(record)) if isinstance(v, record) else ("", v, hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return lambda v: None if any(v == a for a in allowed) else ("", v, hint)
    if origin in (typing.Union, types.UnionType):
        arms = tuple(_check(a) for a in typing.get_args(hint))
        records = tuple(
            a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)
        )

        def union(v: object) -> _Found | None:
            if isinstance(v, records):  # the record's own field is what is wrong
                return _check(type(v))(v)
            return None if any(arm(v) is None for arm in arms) else ("", v, hint)

        return union
    if origin is tuple:
        args = typing.get_args(hint)
        if args[1:] == (...,):
            item = _check(args[0])

            def items(v: object) -> _Found | None:
                if not isinstance(v, tuple):
                    return ("", v, hint)
                for i, x in enumerate(v):
                    found = item(x)
                    if found is not None:
                        return _below(f"[{i}]", found)
                return None

            return items
        each = tuple(_check(a) for a in args)

        def fixed(v: object) -> _Found | None:
            if not isinstance(v, tuple) or len(v) != len(each):
                return ("", v, hint)
            for i, (check, x) in enumerate(zip(each, v, strict=True)):
                found = check(x)
                if found is not None:
                    return _below(f"[{i}]", found)
            return None

        return fixed
    if origin is Mapping:
        key_hint, value_hint = typing.get_args(hint)
        key, value = _check(key_hint), _check(value_hint)

        def mapping(v: object) -> _Found | None:
            if not isinstance(v, Mapping):
                return ("", v, hint)
            for k, x in v.items():
                found = _below(" key", key(k)) or _below(f".{k}", value(x))
                if found is not None:
                    return found
            return None

        return mapping
    return _scalar(hint)


@cache
def _fields(cls: type) -> tuple[tuple[str, _Check], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _check(hints[f.name])) for f in dataclasses.fields(cls))


def _walk(record: object, fields: tuple[tuple[str, _Check], ...]) -> _Found | None:
    for name, check in fields:
        found = check(getattr(record, name))
        if found is not None:
            return _below(f".{name}", found)
    return None


def shape_problem(record: object) -> str | None:
    """The first field of *record* (a dataclass, walked with the ones it nests) whose value
    is not of its annotated type, as ``combinations[3].runs[0].gpu is {...}, not a string``;
    None when every one is."""
    kind: type = type(record)
    found = _check(kind)(record)
    if found is None:
        return None
    path, value, hint = found
    return f"{path.lstrip('.')} is {_shown(value)}, not {_describe(hint)}"
