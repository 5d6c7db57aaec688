"""Right after ``pip install gpu-envbuilder``, outside any checkout, ``envbuilder query``
answers from the lockfile snapshot the wheel carries, and ``export`` pins its closure by
name, version and sha256 (the snapshot is the lockfile only: pylocks name their index's host).

The wheel is built from a copy of the source with the committed snapshot
(``envbuilder/data/``, what ``nox -s snapshot`` wrote) and installed with pip, with its
dependencies, into a fresh venv. Slow: it builds and installs a wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envbuilder.consumer.snapshot import newest_evidence
from envbuilder.lockfile.read import load_lockfile
from tests.integration.test_published_lock import site

__all__ = ["site"]  # the fixture used here

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
COMMITTED = ROOT / "envbuilder" / "data" / "compat.lock.json"
SYNTHETIC = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


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
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "envbuilder", src / "envbuilder", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    build = [UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable]
    subprocess.run([*build, "--out-dir", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("gpu_envbuilder-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "envbuilder/data/compat.lock.json" in names
    assert not [n for n in names if n.startswith("envbuilder/data/locks/")]

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


def test_query_answers_from_the_embedded_lockfile_with_its_date(
    installed: Path, tmp_path: Path
) -> None:
    lock = load_lockfile(COMMITTED)
    day = newest_evidence(lock)
    assert day is not None
    proc = _run(installed, tmp_path, "query")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(
        f"lockfile: the snapshot this envbuilder carries (newest evidence {day}, "
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdicts (the worst of the four uses): ")
    verified = [e.id for e in lock.combinations if e.verdict.verdict == "verified"]
    assert lines[1].split()[:2] == ["verified", verified[0]]


def test_export_pins_the_carried_closure_by_name_and_hash(installed: Path, tmp_path: Path) -> None:
    entry = next(e for e in load_lockfile(COMMITTED).combinations if e.lock is not None)
    proc = _run(installed, tmp_path, "export", entry.id)
    assert proc.returncode == 0, proc.stderr
    pinned = [line for line in proc.stdout.splitlines() if "==" in line]
    assert pinned == [f"{p.name}=={p.version} \\" for p in entry.packages]
    assert proc.stdout.count("--hash=sha256:") == len(entry.packages)
    assert "://" not in proc.stdout  # the user's indexes serve the files


def test_export_fetches_the_locks_from_the_site_named(
    installed: Path, tmp_path: Path, site: tuple[str, Path]
) -> None:
    url = site[0] + "compat.lock.json"
    proc = _run(installed, tmp_path, "export", SYNTHETIC, "--format", "requirements", "--lock", url)
    assert proc.returncode == 0, proc.stderr
    assert "--hash=sha256:" in proc.stdout


def test_a_lockfile_here_wins_over_the_snapshot(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "compat.lock.json").write_text("{}")
    proc = _run(installed, tmp_path, "query")
    assert proc.returncode == 2
    assert "compat.lock.json: unsupported schema None" in proc.stderr


def test_repro_writes_a_failing_checks_script_from_an_empty_directory(
    installed: Path, tmp_path: Path
) -> None:
    """The check records travel with the carried lockfile: no results/ directory needed."""
    failed = sorted(
        check.name
        for entry in load_lockfile(COMMITTED).combinations
        for run in entry.runs
        for check in run.checks
        if check.status == "fail"
    )
    assert failed, "the carried lockfile records no failing check"
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _run(installed, empty, "repro", failed[0], "-o", str(tmp_path / "repro.py"))
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "repro.py").read_text(encoding="utf-8")
    assert script.startswith("#!/usr/bin/env python3\n")
    compile(script, "repro.py", "exec")
    assert list(empty.iterdir()) == []  # nothing written where the user stands
