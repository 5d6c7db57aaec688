"""The consumer commands run on the base dependencies alone: with uv, the Docker SDK,
jsonschema and rich made unimportable (a ``sys.meta_path`` blocker in a fresh
interpreter), ``query`` and ``export`` answer from the synthetic lockfile, and a
command that needs an extra stops with the extra to install."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"
BLOCKED = ("uv", "docker", "jsonschema", "rich")

BLOCKER = f"""
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from envbuilder.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
assert not loaded, loaded
sys.exit(code)
"""


@pytest.fixture(scope="module")
def lockfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("light")
    shutil.copytree(DATA / "locks", root / "locks")
    out = root / "compat.lock.json"
    resolution = str(root / "locks" / "resolution.json")
    lock = ["lock", "--resolution", resolution, "--results", str(DATA / "results")]
    assert main([*lock, "--out", str(out)]) == 0
    return out


def light(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, *args],
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_query_needs_no_extra(lockfile: Path) -> None:
    done = light(
        "query", "--lock", str(lockfile), "--python", "3.11", "--json", cwd=lockfile.parent
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["matches"][0]["id"] == VERIFIED
    assert answer["matches"][0]["verdict"] == "verified"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("pylock", 'lock-version = "1.0"'),
        ("requirements", "--hash=sha256:"),
        ("constraints", "torch==2.5.1"),
    ],
)
def test_export_needs_no_extra(lockfile: Path, fmt: str, expected: str) -> None:
    done = light("export", VERIFIED, "--format", fmt, "--lock", str(lockfile), cwd=lockfile.parent)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_a_missing_extra_is_named(lockfile: Path) -> None:
    done = light(
        "lock",
        "--resolution",
        str(lockfile.parent / "locks" / "resolution.json"),
        cwd=lockfile.parent,
    )
    assert done.returncode == 3
    assert "gpu-envbuilder[resolve]" in done.stderr
    assert "'jsonschema'" in done.stderr
    assert "Traceback" not in done.stderr
