"""``doctor --python PATH`` checks a real virtual environment that has no envbuilder in it:
its distributions found through their RECORD, its files hashed, the probe run there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.read import load_lockfile
from tests.support.wheels import build_wheel

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: the synthetic combination for the running Python, and what the lockfile says of it
COMBINATION = {
    "3.11": ("py3.11-default-torch2.5.1-xformers0.0.28.post3", "✓ verdict: verified"),
    "3.12": ("py3.12-default-torch2.11.0-xformers0.0.35", "! verdict: verified-with-workaround"),
}
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))

pytestmark = [
    pytest.mark.skipif(PYTHON not in COMBINATION, reason=f"no synthetic lock for Python {PYTHON}"),
    pytest.mark.skipif(not Path(UV).exists(), reason="uv is not installed"),
]

#: A CPU-only stand-in for torch and xformers: what the probe asks of them, nothing more.
FAKE = {
    "torch": {
        "torch/__init__.py": b"from torch import cuda, version\n__version__ = '{v}'\n",
        "torch/version.py": b"cuda = None\n",
        "torch/cuda/__init__.py": b"def is_available():\n    return False\n",
    },
    "xformers": {
        "xformers/__init__.py": b"__version__ = '{v}'\n_has_cpp_library = True\n",
        "xformers/ops.py": b"",
    },
}


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A lockfile and a venv holding exactly the combination's locked packages, installed by
    uv from local wheels (by name, so no direct_url.json names a hash)."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(argv) == 0
    lockfile = tmp_path / "compat.lock.json"
    entry = load_lockfile(lockfile).by_id()[COMBINATION[PYTHON][0]]
    wheels = tmp_path / "wheels"
    for pin in entry.packages:
        assert pin.version is not None
        members = {
            k: v.replace(b"{v}", pin.version.encode()) for k, v in FAKE.get(pin.name, {}).items()
        }
        build_wheel(wheels, pin.name, pin.version, members=members or None)
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    requirements = [f"{p.name}=={p.version}" for p in entry.packages]
    install = [UV, "pip", "install", "--python", str(python), "--no-index"]
    subprocess.run(
        [*install, "--find-links", str(wheels), *requirements],
        check=True,
        capture_output=True,
        env=dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_CACHE="1"),
    )
    return lockfile, python


def doctor(lockfile: Path, python: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """envbuilder from this checkout, run from a directory outside it."""
    command = [sys.executable, "-m", "envbuilder", "doctor", "--lock", str(lockfile)]
    return subprocess.run(
        [*command, "--python", str(python), *extra],
        capture_output=True,
        text=True,
        cwd=lockfile.parent,
        # wide enough that a long temporary path keeps each finding on its line (the width
        # rules have tests of their own)
        env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="1000"),
        timeout=300,
        check=False,
    )


def test_doctor_checks_another_environment(environment: tuple[Path, Path]) -> None:
    lockfile, python = environment
    combination, verdict = COMBINATION[PYTHON]
    probe = subprocess.run([python, "-c", "import envbuilder"], capture_output=True, check=False)
    assert probe.returncode != 0  # nothing of envbuilder is installed there

    # the stand-ins have no shared objects to link: import them (--full-probe)
    first = doctor(lockfile, python, "--full-probe")
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == f"interpreter: Python {PYTHON} at {python} (--python)"
    assert lines[1] == f"envbuilder doctor: {python} against {lockfile}"
    assert f"  ✓ combination: {combination} (Python {PYTHON}," in first.stdout
    assert verdict in first.stdout
    assert "  ✓ versions: all 3 locked packages match" in lines
    files = [line for line in lines if "installed-files" in line]
    assert len(files) == 1 and " hashed, 0 unchanged since the last check" in files[0]
    assert "  ✓ xformers-extension:" in first.stdout
    assert "not checked: GPU smoke: not run (torch sees no CUDA GPU here)" in lines
    assert lines[-1].startswith(
        f"✓ every check holds for {combination} (its verdict in the lockfile: "
    )
    assert (python.parent.parent / ".envbuilder-doctor-stamp.json").is_file()

    # the stamp in that environment vouches for every file the second time
    second = doctor(lockfile, python, "--no-probe", "--json")
    found = {f["name"]: f for f in json.loads(second.stdout)["findings"]}
    assert found["installed-files"]["status"] == "pass"
    assert "(0 hashed, " in found["installed-files"]["detail"]
    assert found["probe"]["status"] == "skip"

    # by default, with no GPU here, torch's libraries are loaded without importing it; the
    # stand-in has none, and then an import decides: the stand-in imports, so it passes
    light = doctor(lockfile, python, "--no-hashes")
    assert light.returncode == 0, light.stdout
    assert "torch's libraries do not load" not in light.stdout
    assert "not imported" not in light.stdout

    # a file of that environment changed: found, named, and the doctor fails
    site = next((python.parent.parent / "lib").glob("python*/site-packages"))
    (site / "xformers" / "ops.py").write_text("tampered = True\n")
    third = doctor(lockfile, python, "--no-probe")
    assert third.returncode == 1
    assert "xformers: xformers/ops.py modified" in third.stdout
    assert "failed: file hashes" in third.stdout.splitlines()


def test_doctor_names_an_interpreter_that_is_not_one(tmp_path: Path) -> None:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    lockfile = tmp_path / "compat.lock.json"
    argv = ["lock", "--resolution", str(tmp_path / "locks" / "resolution.json")]
    assert main([*argv, "--results", str(DATA / "results"), "-o", str(lockfile)]) == 0
    proc = doctor(lockfile, tmp_path / "no-such-python")
    assert proc.returncode == 2
    assert f"bad --python {str(tmp_path / 'no-such-python')!r}: no such file" in proc.stderr
