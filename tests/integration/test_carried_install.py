"""Right after ``pip install gpu-envbuilder``, from an empty directory: ``install ID`` installs
from the lockfile the wheel carries (no pylock, no host in it), fetching from the index the
user's configuration names (``PIP_INDEX_URL``), every file checked against its sha256; a
tampered file is refused; without uv it installs through pip.

The carried lockfile is made the way a release makes it: demo wheels served by a local
Simple API index, locked by uv, merged by ``envbuilder lock`` and written into the wheel's
``envbuilder/data/`` by ``envbuilder snapshot``; the wheel is then built and installed into a
fresh venv. Slow: it builds and installs a wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuilder.cli import main
from tests.integration.test_export_install import PY, UNVERIFIED, VERIFIED, make_repo
from tests.support.index_server import IndexServer
from tests.support.wheels import build_wheel

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Simple API index on loopback serving the demo closure (a needs b==2.0)."""
    wheels = tmp_path_factory.mktemp("index-wheels")
    a = build_wheel(wheels, "envb-demo-a", "1.0", requires_dist=["envb-demo-b==2.0"])
    b = build_wheel(wheels, "envb-demo-b", "2.0")
    with IndexServer() as server:
        yield server.add_index("simple", {"envb-demo-a": [a], "envb-demo-b": [b]})


@pytest.fixture(scope="module")
def tampered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same files by name, b's bytes changed: what a compromised mirror serves."""
    wheels = tmp_path_factory.mktemp("tampered-wheels")
    a = build_wheel(wheels, "envb-demo-a", "1.0", requires_dist=["envb-demo-b==2.0"])
    b = build_wheel(wheels, "envb-demo-b", "2.0", members={"envb_demo_b/evil.py": b"x = 1\n"})
    with IndexServer() as server:
        yield server.add_index("simple", {"envb-demo-a": [a], "envb-demo-b": [b]})


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, index: str) -> Path:
    """envbuilder's wheel, carrying the demo lockfile only, pip-installed into a fresh venv;
    that venv's bin/ directory."""
    if not Path(UV).exists():
        pytest.skip(f"uv (to lock and build) is not installed beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("carried")
    repo = tmp / "repo"
    req = tmp / "demo.in"
    req.write_text("envb-demo-a\n")
    args = ["--index-url", index, str(req)]
    lockfile = make_repo(repo, {VERIFIED: args, UNVERIFIED: args}, {VERIFIED})
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "envbuilder", src / "envbuilder", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    assert main(["snapshot", str(lockfile), str(src / "envbuilder" / "data")]) == 0
    build = [UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable]
    subprocess.run([*build, "--out-dir", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("gpu_envbuilder-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("envbuilder/data/locks/")]
    venv = tmp / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)]
    subprocess.run(pip, check=True, cwd=tmp, env=_user_env(tmp, with_uv=False))
    return venv / "bin"


def _user_env(home: Path, *, with_uv: bool, **extra: str) -> dict[str, str]:
    """A user who has only installed the wheel: no checkout, no active venv; uv on PATH or not."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "ENVBUILDER_LOCK", "ENVBUILDER_LOCK_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("UV_")}
    uv_dir = str(Path(UV).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != uv_dir]
    if with_uv:
        path.insert(0, str(home / "uv-only"))
        (home / "uv-only").mkdir(exist_ok=True)
        if not (home / "uv-only" / "uv").exists():
            (home / "uv-only" / "uv").symlink_to(UV)
    else:
        assert all(not (Path(p) / "uv").exists() for p in path), "uv is on PATH outside the venv"
    env["PATH"] = os.pathsep.join(path)
    env["ENVBUILDER_CACHE_DIR"] = str(home / "cache")
    env.update(extra)
    return env


def _install(
    bin_dir: Path, tmp_path: Path, index_url: str, *, with_uv: bool
) -> tuple[subprocess.CompletedProcess[str], Path]:
    empty = tmp_path / "empty"
    empty.mkdir()
    venv = tmp_path / "target"
    argv = ["install", VERIFIED, "--venv", str(venv), "--python", sys.executable]
    proc = subprocess.run(
        [str(bin_dir / "envbuilder"), *argv],
        capture_output=True,
        text=True,
        cwd=empty,
        env=_user_env(tmp_path, with_uv=with_uv, PIP_INDEX_URL=index_url),
        timeout=300,
        check=False,
    )
    assert list(empty.iterdir()) == []  # nothing written where the user stands
    return proc, venv / "bin" / "python"


def _versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m\n"
        "for n in ('envb-demo-a', 'envb-demo-b'):\n"
        "    try: print(m.version(n))\n"
        "    except m.PackageNotFoundError: print('-')\n"
    )
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.skipif(PY != "3.11", reason="the demo rows are locked for this Python")
@pytest.mark.parametrize("with_uv", [True, False], ids=["uv", "pip"])
def test_install_from_the_carried_lockfile_checks_every_hash(
    installed: Path, tmp_path: Path, index: str, with_uv: bool
) -> None:
    proc, python = _install(installed, tmp_path, index, with_uv=with_uv)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "lockfile: the snapshot this envbuilder carries" in out
    assert "files: from your configured indexes" in out
    assert ("uv is not installed here: installing with pip" in out) is not with_uv
    assert "--require-hashes" in out
    assert _versions(python).split() == ["1.0", "2.0"]


@pytest.mark.skipif(PY != "3.11", reason="the demo rows are locked for this Python")
@pytest.mark.parametrize("with_uv", [True, False], ids=["uv", "pip"])
def test_a_tampered_file_is_refused(
    installed: Path, tmp_path: Path, tampered: str, with_uv: bool
) -> None:
    proc, python = _install(installed, tmp_path, tampered, with_uv=with_uv)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "hash" in out.lower()
    assert f"✕ installing {VERIFIED} failed" in out
    assert _versions(python).split() == ["-", "-"]
