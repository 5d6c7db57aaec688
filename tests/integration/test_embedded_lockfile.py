"""Right after ``pip install gpu-envbuilder``, outside any checkout, ``envbuilder query``
answers from the lockfile snapshot the wheel carries.

The snapshot is written as the release writes it (``python -m envbuilder.lockfile.snapshot``,
what ``nox -s snapshot`` runs) from the synthetic lockfile into a copy of the source; the
wheel is built from that copy and installed with pip, with its dependencies, into a fresh
venv. Slow: it builds and installs a wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envbuilder.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user who has only installed the wheel."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "ENVBUILDER_LOCK", "ENVBUILDER_LOCK_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed by pip; its bin/ directory."""
    if not Path(UV).exists():
        pytest.skip(f"uv (to build the wheel) is not installed beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("embedded")
    shutil.copytree(DATA / "locks", tmp / "pipeline" / "locks")
    lockfile = tmp / "pipeline" / "compat.lock.json"
    argv = ["lock", "--resolution", str(tmp / "pipeline" / "locks" / "resolution.json")]
    assert main([*argv, "--results", str(DATA / "results"), "-o", str(lockfile)]) == 0

    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "data")
    shutil.copytree(ROOT / "envbuilder", src / "envbuilder", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "envbuilder.lockfile.snapshot", str(lockfile)],
        check=True,
        cwd=tmp,
        env=_clean_env(PYTHONPATH=str(src)),
    )
    build = [UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable]
    subprocess.run([*build, "--out-dir", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("gpu_envbuilder-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "envbuilder/data/compat.lock.json" in names
    assert f"envbuilder/data/locks/pylock.{VERIFIED}.toml" in names

    venv = tmp / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)]
    subprocess.run(pip, check=True, cwd=tmp, env=_clean_env())
    return venv / "bin"


def _run(bin_dir: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "envbuilder"), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_clean_env(ENVBUILDER_CACHE_DIR=str(cwd / "cache")),
        timeout=120,
        check=False,
    )


def test_query_answers_from_the_embedded_lockfile(installed: Path, tmp_path: Path) -> None:
    proc = _run(installed, tmp_path, "query")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(
        "lockfile: the snapshot this envbuilder carries (newest evidence 2026-"
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdicts (the worst of the four uses): ")
    assert lines[1].split()[:2] == ["verified", VERIFIED]


def test_export_reads_the_embedded_locks(installed: Path, tmp_path: Path) -> None:
    proc = _run(installed, tmp_path, "export", VERIFIED, "--format", "requirements")
    assert proc.returncode == 0, proc.stderr
    assert "--hash=sha256:" in proc.stdout


def test_a_lockfile_here_wins_over_the_snapshot(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "compat.lock.json").write_text("{}")
    proc = _run(installed, tmp_path, "query")
    assert proc.returncode == 2
    assert "compat.lock.json: unsupported schema None" in proc.stderr
