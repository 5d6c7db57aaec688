"""Where the operating system has neither fork nor process groups (Windows), the suite
starts every worker fresh and kills an overrunning one by itself at its time limit."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from envbuilder.conformance import launch


def _hanging_python(tmp_path: Path) -> str:
    """An 'interpreter' that ignores its arguments and hangs."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_worker_past_its_limit_is_killed_without_process_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "_GROUPS", False)
    killed: list[int] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: killed.append(pid))  # must not be used
    start = time.monotonic()
    code = launch.Spawner(_hanging_python(tmp_path)).run([], tmp_path / "out.log", timeout=1.0)
    assert code is None  # killed at the limit
    assert time.monotonic() - start < 20
    assert killed == []


def test_no_fork_means_a_fresh_interpreter_per_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "fork")
    said: list[str] = []
    launcher = launch.Launcher(_hanging_python(tmp_path), tmp_path, said.append, fork_server=True)
    try:
        assert not launcher.forking
        assert launcher.notes["fork_server"] is False
        assert "cannot fork" in launcher.notes["fork_server_error"]
        assert any("fresh interpreter per group" in line for line in said)
    finally:
        launcher.close()
