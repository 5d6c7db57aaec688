"""One help style across every ``envbuilder`` subcommand's ``--help``.

The rules, checked on every argument of every parser ``envbuilder.cli`` builds:

==================  ==========================================================
what                rule
==================  ==========================================================
help                present on every argument
first letter        lowercase, unless the first word is an acronym (``CUDA``, ``GPU``)
last character      no period (nor ``,`` ``;`` ``:``): help lines are phrases
default             shown once, as ``(default: …)`` at the very end; never
                    ``default: …`` outside those parentheses
metavar             every value is named in capitals (``FILE``, ``FILE|URL``,
                    ``VERSION|PATH``), options and positionals alike, unless
                    the value is a closed set
choices             a closed set is listed: argparse's ``{a,b}`` (no metavar),
                    or each choice named in the help
==================  ==========================================================
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from envbuilder.cli import build_parser

_ACRONYM = re.compile(r"^[A-Z][A-Z0-9_]+\b")
_METAVAR = re.compile(r"^[A-Z][A-Z0-9_.]*(\|[A-Z][A-Z0-9_.]*)*$")
_CLOSED_SET = re.compile(r"^\{[a-z0-9_.-]+(,[a-z0-9_.-]+)+\}$")  # as argparse shows choices
_IMPLICIT = (argparse._HelpAction, argparse._VersionAction)


def _arguments() -> Iterator[tuple[str, argparse.Action]]:
    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")
            elif action.help != argparse.SUPPRESS and not isinstance(action, _IMPLICIT):
                yield f"{path} {'/'.join(action.option_strings) or action.dest}", action

    yield from walk(build_parser(), "envbuilder")


ARGUMENTS = dict(_arguments())


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def test_the_walk_sees_every_command() -> None:
    commands = {name.split()[1] for name in ARGUMENTS if len(name.split()) > 2}
    assert {"query", "install", "doctor", "export", "resolve", "lock", "publish"} <= commands


def style_errors(action: argparse.Action) -> list[str]:
    """What breaks the style in *action*'s help, metavar and choices."""
    text = action.help
    if not text:
        return ["no help"]
    errors = []
    if text[0].isupper() and not _ACRONYM.match(text):
        errors.append(f"starts with a capital: {text[:30]!r}")
    if text[-1] in ".,;:":
        errors.append(f"ends with {text[-1]!r}")
    at = text.find("default:")
    if at != -1 and not (text[at - 1 : at] == "(" and text.endswith(")")):
        errors.append(f"default not as '(default: …)' at the end: {text[max(at - 20, 0) :]!r}")
    if text.count("default:") > 1:
        errors.append("default said twice")
    if _takes_value(action):
        if action.choices is None:
            metavar = action.metavar
            named = isinstance(metavar, str) and (
                _METAVAR.match(metavar) or _CLOSED_SET.match(metavar)
            )
            if not named:
                errors.append(f"value named {metavar!r}, not in capitals")
        elif action.metavar is not None:
            missing = [c for c in action.choices if str(c) not in text]
            if missing:
                errors.append(f"choices {missing} not named in the help")
    return errors


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_help_follows_the_one_style(name: str) -> None:
    assert style_errors(ARGUMENTS[name]) == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"help": "the lockfile (default: compat.lock.json)", "metavar": "FILE"}, []),
        ({"help": "The lockfile", "metavar": "FILE"}, ["starts with a capital: 'The lockfile'"]),
        ({"help": "CUDA version", "metavar": "VERSION"}, []),
        ({"help": "the lockfile.", "metavar": "FILE"}, ["ends with '.'"]),
        ({"help": "the lockfile", "metavar": "file"}, ["value named 'file', not in capitals"]),
        ({"help": "the lockfile"}, ["value named None, not in capitals"]),
        (
            {"help": "the lockfile; default: x", "metavar": "FILE"},
            ["default not as '(default: …)' at the end: 'the lockfile; default: x'"],
        ),
        ({"help": "a or b", "choices": ["a", "b"]}, []),
        (
            {"help": "one of them", "choices": ["a", "b"], "metavar": "X"},
            ["choices ['a', 'b'] not named in the help"],
        ),
        ({"help": None, "action": "store_true"}, ["no help"]),
        ({"help": "be quiet", "action": "store_true"}, []),
    ],
)
def test_the_style_check_itself(kwargs: dict[str, object], expected: list[str]) -> None:
    parser = argparse.ArgumentParser()
    action = parser.add_argument("--x", **kwargs)  # type: ignore[arg-type]
    assert style_errors(action) == expected
