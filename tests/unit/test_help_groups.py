"""``envbuilder --help`` lists the commands for people who use a lockfile first, and the
maintainers' pipeline under its own heading; ``install --help`` keeps its rare options in
a group of their own."""

from __future__ import annotations

import pytest

from envbuilder.cli import COMMANDS, CONSUMER_COMMANDS, main

CONSUMER_HEADING = "commands for your environment"
MAINTAINER_HEADING = "maintainer commands"


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out.splitlines()


def _listed(lines: list[str], heading: str) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    names = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if line.startswith("  ") and not line.startswith("   "):
            names.append(line.split()[0])
    return names


@pytest.mark.parametrize("columns", ["80", "120"])
def test_consumer_commands_come_first_and_maintainers_under_their_heading(
    columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    lines = _help(["--help"], capsys)
    consumer, maintainer = _listed(lines, CONSUMER_HEADING), _listed(lines, MAINTAINER_HEADING)
    assert consumer == list(CONSUMER_COMMANDS)
    assert maintainer == [name for name in COMMANDS if name not in CONSUMER_COMMANDS]
    heading = [i for i, line in enumerate(lines) if line.startswith(MAINTAINER_HEADING)]
    options = [i for i, line in enumerate(lines) if line.startswith("options:")]
    assert heading and options and heading[0] < options[0]  # both lists before the options
    assert all(len(line) <= int(columns) for line in lines if not line.startswith("usage"))


def test_installs_rare_options_have_a_group_of_their_own(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    lines = _help(["install", "--help"], capsys)
    start = lines.index("rarely needed:")
    rare = [line.split()[0] for line in lines[start + 1 :] if line.startswith("  --")]
    assert rare == ["--installer", "--with-suite", "--wheel", "--build-cache"]
    common = [line.split()[0] for line in lines[:start] if line.startswith("  --")]
    assert {"--python", "--venv", "--dry-run", "--allow-unverified"} <= set(common)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_commands_help_line_is_in_the_house_style(name: str) -> None:
    """As every argument's help (test_help_style): a lowercase phrase, no closing period."""
    import importlib

    text: str = importlib.import_module(COMMANDS[name]).HELP
    assert text[0].islower(), text
    assert text[-1] not in ".,;:", text
