"""A user's machine for ``install`` tests: the synthetic lockfile locked in the working
directory, an active Python 3.11 venv with pip (as its files show it), and no uv."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"


def pip_venv_without_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` made the working directory, with ``compat.lock.json`` of the synthetic
    results, ``user-venv`` active, an empty PATH (no uv, no nvidia-smi) and no ``uv``
    package to import."""
    venv = tmp_path / "user-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nversion = 3.11.7\n")
    (venv / "lib" / "python3.11" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "pip" / "__init__.py").touch()
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "envbuilder-cache"))
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(argv) == 0
    (tmp_path / "empty-path").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setitem(sys.modules, "uv", None)  # `import uv` fails
    return tmp_path
