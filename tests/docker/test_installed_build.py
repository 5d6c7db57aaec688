"""``envbuilder build`` from the installed wheel, outside any checkout: the image recipe ships
as package data, so a user who installed ``gpu-envbuilder[docker]`` can build images."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.docker.plan import image_tag, lock_digest
from envbuilder.model import lock_filename
from tests.docker.conftest import TORCH_ID

ROOT = Path(__file__).resolve().parents[2]
UV = str(Path(sys.executable).with_name("uv"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the built wheel with its ``docker`` extra; its bin/ directory."""
    if not Path(UV).exists():
        pytest.skip(f"uv is not installed beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"
    shutil.copytree(
        ROOT / "envbuilder", src / "envbuilder", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    build = [UV, "build", "--wheel", "--no-build-isolation", "--python", sys.executable]
    subprocess.run([*build, "--out-dir", str(tmp / "dist"), str(src)], check=True)
    (wheel,) = (tmp / "dist").glob("gpu_envbuilder-*-py3-none-any.whl")
    venv = tmp / "venv"
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [UV, "pip", "install", "-q", "--python", str(venv), f"{wheel}[docker]"], check=True
    )
    return venv / "bin"


def test_the_installed_wheel_builds_an_image_outside_the_checkout(
    installed: Path, docker_client: object, base_image: str, torch_locks: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Outside a git checkout the image's revision label would say "unknown"; the image this
    # leaves behind is the one other Docker tests reuse, so give it this checkout's revision.
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(installed), os.environ.get("PATH", "")]),
        "PYTHONPATH": "",
        "ENVBUILDER_SOURCE_REVISION": revision or "test-revision",
    }
    build = ["build", "--all", "--force", "--no-cache", "--locks", str(torch_locks)]
    done = subprocess.run(
        [str(installed / "envbuilder"), *build, "--log-dir", str(tmp_path / "logs")],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lock = torch_locks / lock_filename(TORCH_ID)
    assert image_tag(TORCH_ID, lock_digest(lock.read_bytes())) in done.stdout.split()
    # the command ran from the wheel, not from a checkout on sys.path
    where = subprocess.run(
        [str(installed / "python"), "-c", "import envbuilder; print(envbuilder.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(ROOT) not in where and "site-packages" in where
