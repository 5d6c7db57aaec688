"""A Windows row's added CUDA runtime is found through ``PATH`` in the Windows venv layout,
never through ``LD_LIBRARY_PATH`` or the POSIX activate hooks; a venv's interpreter is
``Scripts\\python.exe`` there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envbuilder.consumer.install import on_windows, runtime_line, venv_python
from envbuilder.lockfile.model import Entry
from envbuilder.lockfile.read import load_lockfile
from envbuilder.target import cuda_runtime_library_dir, library_path

COMMITTED = Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json"


def _cudart_row() -> Entry:
    return next(e for e in load_lockfile(COMMITTED).combinations if e.extra_runtime)


def _on(entry: Entry, platform: str) -> Entry:
    cell = dataclasses.replace(entry.resolved.combination, platform=platform)
    return dataclasses.replace(
        entry, resolved=dataclasses.replace(entry.resolved, combination=cell)
    )


# where the runtime wheels for win_amd64 put their DLLs (read from the wheels themselves:
# nvidia/cuda_runtime/bin/cudart64_12.dll, nvidia/cu13/bin/x86_64/cudart64_13.dll)
@pytest.mark.parametrize(
    ("requirement", "windows", "posix"),
    [
        ("nvidia-cuda-runtime-cu12==12.8.90", "nvidia/cuda_runtime/bin", "nvidia/cuda_runtime/lib"),
        ("nvidia-cuda-runtime==13.0.96", "nvidia/cu13/bin/x86_64", "nvidia/cu13/lib"),
    ],
)
def test_runtime_directory_per_platform(requirement: str, windows: str, posix: str) -> None:
    assert cuda_runtime_library_dir(requirement, windows=True) == windows
    assert cuda_runtime_library_dir(requirement) == posix


def test_windows_library_path_is_the_venv_lib_site_packages_joined_by_semicolons() -> None:
    runtimes = ["nvidia-cuda-runtime-cu12==12.8.90", "nvidia-cuda-runtime==13.0.96"]
    path = library_path(runtimes, python="3.12", venv=r"C:\envs\a b", windows=True)
    assert path == (
        r"C:\envs\a b\Lib\site-packages\nvidia\cuda_runtime\bin;"
        r"C:\envs\a b\Lib\site-packages\nvidia\cu13\bin\x86_64"
    )


def test_a_windows_row_puts_its_runtime_on_path() -> None:
    row = _on(_cudart_row(), "win_amd64")
    assert on_windows(row)
    line = runtime_line(row, r"C:\envs\x")
    assert line is not None
    assert "LD_LIBRARY_PATH" not in line and "PATH" in line
    assert r"C:\envs\x\Lib\site-packages\nvidia" in line


def test_a_linux_row_keeps_ld_library_path() -> None:
    row = _cudart_row()
    assert not on_windows(row)
    line = runtime_line(row, "/envs/x")
    assert line is not None and 'export LD_LIBRARY_PATH="/envs/x/lib/python' in line


def test_venv_interpreter_per_os() -> None:
    assert venv_python(Path("v"), windows=True) == Path("v") / "Scripts" / "python.exe"
    assert venv_python(Path("v"), windows=False) == Path("v") / "bin" / "python"
