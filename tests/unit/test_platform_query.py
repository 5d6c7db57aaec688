"""Queries and install serve a host only the rows of its own operating system."""

from __future__ import annotations

import dataclasses

import pytest

from envbuilder.consumer.host import detect_host, host_family
from envbuilder.consumer.query import Query, answer
from envbuilder.lockfile.model import CompatLock


@pytest.mark.parametrize(
    ("system", "family"),
    [
        ("win32", "windows"),
        ("cygwin", "windows"),
        ("darwin", "macos"),
        ("linux", "linux"),
        ("freebsd14", ""),
    ],
)
def test_host_family(system: str, family: str) -> None:
    assert host_family(system) == family


def test_the_detected_host_names_its_operating_system() -> None:
    host = detect_host(which=lambda _: None, nvml=lambda: None)
    assert host.os == host_family() == "linux"  # the machine the tests run on


def _with_a_windows_row(compat: CompatLock) -> tuple[CompatLock, str]:
    """The lockfile with its first row moved to win_amd64 (under a new id)."""
    first = compat.combinations[0]
    cell = dataclasses.replace(
        first.resolved.combination, id=first.id + "-win", platform="win_amd64"
    )
    windows = dataclasses.replace(
        first, resolved=dataclasses.replace(first.resolved, combination=cell)
    )
    return dataclasses.replace(compat, combinations=(*compat.combinations, windows)), windows.id


def test_a_windows_host_is_served_the_windows_rows_only(compat: CompatLock) -> None:
    lock, windows_id = _with_a_windows_row(compat)
    result = answer(lock, Query(os="windows"))
    assert [m.entry.id for m in result.matches if m.entry.id == windows_id] == [windows_id]
    assert all(m.entry.platform == "win_amd64" for m in result.matches)
    reasons = {r.entry.id: r.reasons for r in result.rejected}
    linux = compat.combinations[0]
    assert reasons[linux.id] == (f"for {linux.platform} (linux), not a windows host",)


def test_a_linux_host_is_not_served_the_windows_rows(compat: CompatLock) -> None:
    lock, windows_id = _with_a_windows_row(compat)
    result = answer(lock, Query(os="linux"))
    assert windows_id not in {m.entry.id for m in result.matches}
    assert {r.entry.id: r.reasons for r in result.rejected}[windows_id] == (
        "for win_amd64 (windows), not a linux host",
    )
    # asked without an operating system, the query is what it was
    assert [m.entry.id for m in answer(compat, Query(os="linux")).matches] == [
        m.entry.id for m in answer(compat, Query()).matches
    ]
