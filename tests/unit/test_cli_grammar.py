"""One grammar for every command: where global options go, what an error shows, no
abbreviations, did-you-mean, one spelling for outputs, build asks for a selection."""

from __future__ import annotations

import argparse

import pytest

from envbuilder.cli import COMMANDS, build_parser, main, parse


@pytest.mark.parametrize(
    ("argv", "debug", "verbose"),
    [
        (["query"], False, 0),
        (["--debug", "query"], True, 0),
        (["query", "--debug"], True, 0),
        (["-v", "query"], False, 1),
        (["query", "-v"], False, 1),
        (["-v", "query", "-vv"], False, 3),
        (["--debug", "-v", "export", "ID", "--debug", "-v"], True, 2),
    ],
)
def test_global_options_before_or_after_the_command(
    argv: list[str], debug: bool, verbose: int
) -> None:
    args = parse(argv)
    assert (args.debug, args.verbose) == (debug, verbose)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["qeury"], "unknown command 'qeury'; did you mean 'query'?"),
        (["exprot", "ID"], "did you mean 'export'?"),
        (["frobnicate"], "unknown command 'frobnicate' (commands: resolve,"),
        # 3.11 is taken as the combination's ID: the unknown option is what is named
        (["query", "--pyth", "3.11"], "unrecognized arguments: --pyth; did you mean '--python'?\n"),
        (["query", "--js"], "unrecognized arguments: --js; did you mean '--json'?"),
        (["export", "ID", "--form", "pylock"], "--form pylock; did you mean '--format'?"),
        (["install", "--dryrun"], "unrecognized arguments: --dryrun; did you mean '--dry-run'?"),
        (["doctor", "--zzz"], "unrecognized arguments: --zzz\n"),
        (["build"], "give one or more SELECTORs"),
        (["build", "cu121", "--all"], "not both"),
    ],
)
def test_errors_name_the_problem_with_the_commands_usage(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    typed = argv[0]
    usage = f"usage: envbuilder {typed} " if typed in COMMANDS else "usage: envbuilder [-h]"
    assert err.startswith(usage)


@pytest.mark.parametrize(
    ("argv", "selectors", "all_"),
    [(["build", "cu121"], ["cu121"], False), (["build", "--all"], [], True)],
)
def test_build_takes_selectors_or_all(argv: list[str], selectors: list[str], all_: bool) -> None:
    args = parse(argv)
    assert (args.selectors, args.all) == (selectors, all_)


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("resolve", []),
        ("lock", []),
        ("publish", []),
        ("export", ["ID"]),
        ("conformance", ["ID"]),
    ],
)
def test_every_output_is_spelled_o_or_out(command: str, extra: list[str]) -> None:
    short = parse([command, *extra, "-o", "x"])
    long = parse([command, *extra, "--out", "x"])
    dest = "out_dir" if command == "conformance" else "out"
    assert str(getattr(short, dest)) == str(getattr(long, dest)) == "x"


def test_conformance_keeps_out_dir_as_a_hidden_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert str(parse(["conformance", "ID", "--out-dir", "r"]).out_dir) == "r"
    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    assert "--out-dir" not in capsys.readouterr().out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_takes_abbreviations(command: str) -> None:
    parser = build_parser()
    assert parser.allow_abbrev is False
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        command
    ]
    assert sub.allow_abbrev is False
