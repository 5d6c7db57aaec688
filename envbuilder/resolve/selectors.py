"""Selectors pick combinations out of a matrix: ``cu121``, ``12.1``, ``cpu``,
``py3.11``, ``torch2.5``, ``xformers0.0.28``, ``cudart``, an exact id, a glob
on ids (``py3.1?-cu12*``), or atoms joined by ``-`` that must all hold
(``py3.11-torch2.5``). Several selectors select the union; none selects all.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from envbuilder.errors import InputError
from envbuilder.model import Combination
from envbuilder.target import PYTHON_VERSION, parse_cuda_build

__all__ = ["Selector", "parse_selector", "select"]

_GLOB_CHARS = frozenset("*?[")

Predicate = Callable[[Combination], bool]


def _release_prefix(wanted: Version) -> Callable[[str | None], bool]:
    """``2.5`` matches 2.5.0 and 2.5.1 but not 2.50; a selector with a pre/post/dev part matches exactly."""
    exact = wanted.pre is not None or wanted.post is not None or wanted.dev is not None

    def matches(version: str | None) -> bool:
        if version is None:
            return False
        have = Version(version)
        if exact:
            return have == wanted
        return have.release[: len(wanted.release)] == wanted.release

    return matches


def _atom(text: str) -> Predicate | None:
    """One selector atom as a predicate, or None when it is not one."""
    cuda = parse_cuda_build(text)
    if cuda is not None:
        return lambda c: c.cuda == cuda
    if text == "cudart":
        return lambda c: c.add_cuda_runtime
    for prefix, attr in (("py", "python"), ("torch", "torch"), ("xformers", "xformers")):
        if not text.startswith(prefix):
            continue
        rest = text[len(prefix) :]
        if prefix == "py":
            if not PYTHON_VERSION.fullmatch(rest):
                return None
            return lambda c: c.python == rest
        try:
            matches = _release_prefix(Version(rest))
        except InvalidVersion:
            return None
        return _field_matches(attr, matches)
    return None


def _field_matches(attr: str, matches: Callable[[str | None], bool]) -> Predicate:
    return lambda c: matches(getattr(c, attr))


@dataclass(frozen=True, kw_only=True)
class Selector:
    """A parsed selector: its text and the predicate it stands for."""

    text: str
    predicate: Predicate

    def __call__(self, combination: Combination) -> bool:
        return self.predicate(combination)


def parse_selector(text: str, known_ids: Iterable[str] = ()) -> Selector:
    """Parse one selector; raise InputError for text that is no selector at all."""
    if not text:
        raise InputError("empty selector; use e.g. 'cu121', 'py3.11', 'torch2.5' or an id")
    if _GLOB_CHARS & set(text):
        return Selector(text=text, predicate=lambda c: fnmatch.fnmatchcase(c.id, text))
    if text in set(known_ids):
        return Selector(text=text, predicate=lambda c: c.id == text)
    parts = text.split("-")
    predicates: list[Predicate] = []
    for part in parts:
        atom = _atom(part)
        if atom is None:
            raise InputError(_unknown_message(text, part, known_ids))
        predicates.append(atom)
    return Selector(text=text, predicate=lambda c: all(p(c) for p in predicates))


def _unknown_message(text: str, part: str, known_ids: Iterable[str]) -> str:
    message = f"selector {text!r}: {part!r} is not a selector"
    if PYTHON_VERSION.fullmatch(part):
        message += f" (for Python write 'py{part}')"
    message += (
        "; use cu121 or 12.1, cpu, default, py3.11, torch2.5, xformers0.0.28, cudart,"
        " an id or a glob on ids"
    )
    return message + _did_you_mean(text, known_ids)


def _did_you_mean(text: str, known_ids: Iterable[str]) -> str:
    close = difflib.get_close_matches(text, list(known_ids), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def select(
    combinations: Sequence[Combination], selectors: Sequence[str]
) -> tuple[Combination, ...]:
    """The union of what each selector matches, in the matrix's order; no selector = all.

    Every selector must match something: one that matches nothing is an InputError
    (a typo would otherwise silently shrink a run), with close ids suggested.
    """
    if not selectors:
        return tuple(combinations)
    ids = [c.id for c in combinations]
    problems: list[str] = []
    parsed: list[Selector] = []
    for text in selectors:
        try:
            parsed.append(parse_selector(text, ids))
        except InputError as e:
            problems.append(str(e))
    for selector in parsed:
        if not any(selector(c) for c in combinations):
            problems.append(
                f"selector {selector.text!r} matches no combination"
                + _did_you_mean(selector.text, ids)
            )
    if problems:
        raise InputError("\n".join(problems))
    return tuple(c for c in combinations if any(s(c) for s in parsed))
