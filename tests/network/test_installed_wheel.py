"""The wheel as a user gets it: built from the source, installed with its base dependencies
only (from the configured package index: hence tests/network) into a fresh venv outside
the checkout, and run from a directory outside it: ``query --here`` with a fake
``nvidia-smi``, ``export`` in every format, ``install`` into another venv from a loopback
index, ``doctor --python`` on that venv. ``build`` is left to the Docker tests."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.export import FORMATS
from tests.integration.test_doctor_other_env import COMBINATION, PYTHON, environment
from tests.integration.test_export_install import (  # the demo repository on loopback
    UV,
    VERIFIED,
    demo_lock,
    installed,
    wheel_server,
)
from tests.integration.test_host_detection import _fake_nvidia_smi

__all__ = ["demo_lock", "environment", "wheel_server"]  # fixtures used here

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SYNTHETIC = "py3.11-default-torch2.5.1-xformers0.0.28.post3"
EXTRAS_ONLY = ("uv", "docker", "jsonschema", "rich")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the built wheel and its base dependencies; its bin/ directory."""
    if not Path(UV).exists():
        pytest.skip(f"uv is not installed beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "envbuilder", src / "envbuilder", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    build = [UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable]
    subprocess.run([*build, "--out-dir", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("gpu_envbuilder-*-py3-none-any.whl")
    venv = tmp / "app"
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([UV, "pip", "install", "-q", "--python", str(venv), str(wheel)], check=True)
    return venv / "bin"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    shutil.copytree(DATA / "locks", root / "locks")
    lock = ["lock", "--resolution", str(root / "locks" / "resolution.json")]
    out = root / "compat.lock.json"
    assert main([*lock, "--results", str(DATA / "results"), "-o", str(out)]) == 0
    return out


def envbuilder(
    app: Path, cwd: Path, *args: str, path: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The installed command, from ``cwd``, with no checkout on sys.path and no uv on PATH."""
    search = os.pathsep.join([str(app), *map(str, path), "/usr/bin", "/bin"])
    env = {"PATH": search, "HOME": str(cwd), "ENVBUILDER_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run(
        [str(app / "envbuilder"), *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_the_base_install_has_no_extra(app: Path) -> None:
    code = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    done = subprocess.run(
        [str(app / "python"), "-I", "-c", code, *EXTRAS_ONLY],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the synthetic locks are x86_64")
def test_query_here(app: Path, synthetic: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    _fake_nvidia_smi(fake, "NVIDIA H100 80GB HBM3, 9.0, 580.65.06\n")
    done = envbuilder(app, tmp_path, "query", "--here", "--lock", str(synthetic), path=(fake,))
    assert done.returncode == 0, done.stderr
    assert "this machine: Python 3.11" in done.stdout
    assert "580.65.06" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interpreter: ")  # the user's, named first
    header = next(i for i, line in enumerate(lines) if line.startswith("verdicts "))
    assert lines[header + 1].split()[:2] == ["verified", SYNTHETIC]  # ranked first


@pytest.mark.parametrize("fmt", FORMATS)
def test_export(app: Path, synthetic: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / ("pylock.out.toml" if fmt == "pylock" else f"{fmt}.txt")
    done = envbuilder(
        app,
        tmp_path,
        "export",
        SYNTHETIC,
        "--format",
        fmt,
        "--lock",
        str(synthetic),
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    expected = {"pylock": 'name = "torch"', "requirements": "--hash=sha256:"}
    assert expected.get(fmt, "torch==2.5.1") in text


def test_install_and_doctor_another_venv(app: Path, demo_lock: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    python = target / "bin" / "python"
    lock = ["--lock", str(demo_lock)]
    # without the [install] extra and no uv on PATH, asking for uv says what to do
    refused = envbuilder(
        app, tmp_path, "install", VERIFIED, "--python", str(python), "--installer", "uv", *lock
    )
    assert refused.returncode == 3
    assert "gpu-envbuilder[install]" in refused.stderr and "--installer pip" in refused.stderr
    probe = "import importlib.util as u; print(u.find_spec('envb_demo_a') is None)"
    untouched = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    assert untouched.stdout.strip() == "True"  # nothing half-installed
    # the default installer falls back to pip, with hashes required, and says so
    done = envbuilder(app, tmp_path, "install", VERIFIED, "--python", str(python), *lock)
    assert done.returncode == 0, done.stderr
    assert "installing with pip (--require-hashes)" in done.stdout + done.stderr
    assert installed(python, "envb-demo-a", "envb-demo-b") == ["1.0", "2.0"]


@pytest.mark.skipif(PYTHON not in COMBINATION, reason=f"no synthetic lock for Python {PYTHON}")
def test_doctor_python(app: Path, environment: tuple[Path, Path], tmp_path: Path) -> None:
    """The installed doctor checks a venv holding the synthetic combination's packages."""
    lockfile, python = environment
    argv = ["doctor", "--python", str(python), "--lock", str(lockfile), "--json"]
    done = envbuilder(app, tmp_path, *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["combination"], report["ok"]) == (COMBINATION[PYTHON][0], True)
    found = {f["name"]: f["status"] for f in report["findings"]}
    assert found["versions"] == found["installed-files"] == "pass"
