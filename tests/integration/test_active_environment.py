"""The consumer commands act on the user's environment, not on envbuilder's own.

envbuilder is installed in a venv of its own (as ``uv tool`` or ``pipx`` do); another
venv, the user's, is active. ``doctor``, ``install --dry-run`` and ``query --here`` name
the active venv's interpreter on their first line and act on it. Both venvs are real,
made by ``python -m venv``.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.read import load_lockfile
from tests.support.wheels import build_wheel

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
#: the synthetic combination of each Python the user's venv may have
COMBINATION = {
    "3.11": "py3.11-default-torch2.5.1-xformers0.0.28.post3",
    "3.12": "py3.12-default-torch2.11.0-xformers0.0.35",
}
FAKE = {
    "torch": {"torch/__init__.py": b"__version__ = '{v}'\n"},
    "xformers": {"xformers/__init__.py": b"__version__ = '{v}'\n"},
}

pytestmark = pytest.mark.skipif(not Path(UV).exists(), reason="uv is not installed")


def _other_python() -> tuple[str, str]:
    """A base interpreter for the user's venv: Python 3.12 where uv finds one (so that the two
    venvs differ in version too), else the running one's base."""
    found = subprocess.run(
        [UV, "python", "find", "3.12"],
        capture_output=True,
        text=True,
        env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"),
        check=False,
    )
    if found.returncode == 0 and found.stdout.strip():
        return found.stdout.strip(), "3.12"
    return sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("two-venvs")
    shutil.copytree(DATA / "locks", root / "locks")
    lockfile = root / "compat.lock.json"
    argv = ["lock", "--resolution", str(root / "locks" / "resolution.json")]
    assert main([*argv, "--results", str(DATA / "results"), "-o", str(lockfile)]) == 0

    # envbuilder's own venv: this checkout and this interpreter's packages, by a .pth file
    tool = root / "tool"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tool)], check=True)
    tool_site = next((tool / "lib").glob("python*/site-packages"))
    (tool_site / "envbuilder-checkout.pth").write_text(
        "\n".join([str(ROOT), *site.getsitepackages()]) + "\n"
    )

    # the user's venv, holding the combination of its Python (stand-ins for torch, xformers)
    base, version = _other_python()
    user = root / "user"
    subprocess.run([base, "-m", "venv", "--without-pip", str(user)], check=True)
    entry = load_lockfile(lockfile).by_id()[COMBINATION[version]]
    wheels = root / "wheels"
    for pin in entry.packages:
        assert pin.version is not None
        members = {
            k: v.replace(b"{v}", pin.version.encode()) for k, v in FAKE.get(pin.name, {}).items()
        }
        build_wheel(wheels, pin.name, pin.version, members=members or None)
    subprocess.run(
        [
            UV,
            "pip",
            "install",
            "--python",
            str(user / "bin" / "python"),
            "--no-index",
            "--find-links",
            str(wheels),
            *(f"{p.name}=={p.version}" for p in entry.packages),
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_CACHE="1"),
    )
    return {"root": root, "lockfile": lockfile, "tool": tool, "user": user, "version": version}


def envbuilder(setup: dict[str, Path | str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The tool venv's envbuilder, run with the user's venv active (as `activate` does)."""
    user = Path(setup["user"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONDA_PREFIX")}
    env.update(
        VIRTUAL_ENV=str(user),
        PATH=f"{user / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        ENVBUILDER_CACHE_DIR=str(Path(setup["root"]) / "cache"),
    )
    tool_python = Path(setup["tool"]) / "bin" / "python"
    return subprocess.run(
        [str(tool_python), "-m", "envbuilder", *argv, "--lock", str(setup["lockfile"])],
        capture_output=True,
        text=True,
        cwd=setup["root"],
        env=env,
        timeout=300,
        check=False,
    )


def _first_line(setup: dict[str, Path | str]) -> str:
    python = Path(setup["user"]) / "bin" / "python"
    return f"interpreter: Python {setup['version']} at {python} ($VIRTUAL_ENV)"


def test_doctor_checks_the_active_venv(setup: dict[str, Path | str]) -> None:
    proc = envbuilder(setup, "doctor", "--no-probe")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == _first_line(setup)
    combination = COMBINATION[str(setup["version"])]
    assert f"  ✓ combination: {combination} (Python {setup['version']}," in proc.stdout
    assert "  ✓ versions: all 3 locked packages match" in lines


def test_install_dry_run_targets_the_active_venv(setup: dict[str, Path | str]) -> None:
    combination = COMBINATION[str(setup["version"])]
    proc = envbuilder(setup, "install", combination, "--dry-run", "--allow-unverified")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()  # install reports on stderr
    assert lines[0] == _first_line(setup)
    python = Path(setup["user"]) / "bin" / "python"
    install = [line for line in lines if line.startswith("+ ") and " pip install " in line]
    assert len(install) == 1 and f"--python {python} " in install[0]


def test_install_without_an_id_chooses_for_the_active_venvs_python(
    setup: dict[str, Path | str],
) -> None:
    proc = envbuilder(setup, "install", "--dry-run", "--allow-unverified")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == _first_line(setup)
    assert lines[1].startswith(f"combination py{setup['version']}-")


def test_query_here_judges_for_the_active_venv(setup: dict[str, Path | str]) -> None:
    proc = envbuilder(setup, "query", "--here")
    lines = proc.stdout.splitlines()
    assert lines[0] == _first_line(setup), proc.stdout + proc.stderr
    assert lines[1].startswith(f"this machine: Python {setup['version']}, ")


def test_an_interpreter_named_by_python_wins_over_the_active_venv(
    setup: dict[str, Path | str],
) -> None:
    proc = envbuilder(setup, "doctor", "--no-probe", "--python", sys.executable)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert proc.stdout.splitlines()[0] == (
        f"interpreter: Python {version} at {sys.executable} (--python)"
    )


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_dry_run_fails_where_the_real_run_fails(
    setup: dict[str, Path | str], dry_run: bool
) -> None:
    """Python 3.10 is nowhere here: the dry run says so as the real run does."""
    combination = COMBINATION[str(setup["version"])]
    other = "py3.10-default-torch2.4.1-xformers0.0.28.post1"
    flags = ["--dry-run"] if dry_run else []
    proc = envbuilder(setup, "install", other, "--allow-unverified", *flags)
    assert proc.returncode == 2, proc.stderr
    user = Path(setup["user"]) / "bin" / "python"
    assert f"{user} is Python {setup['version']}, but {other!r} needs Python 3.10" in proc.stderr
    assert combination not in proc.stderr


def test_a_dry_run_keeps_the_lock_its_command_names(setup: dict[str, Path | str]) -> None:
    combination = COMBINATION[str(setup["version"])]
    proc = envbuilder(setup, "install", combination, "--dry-run", "--allow-unverified")
    lines = proc.stderr.splitlines()
    (kept,) = [line.split()[1] for line in lines if line.startswith("lock: ")]
    (command,) = [line for line in lines if line.startswith("+ ") and " pip install " in line]
    assert command.endswith(f" -r {kept}")
    pylock = Path(setup["root"]) / "locks" / f"pylock.{combination}.toml"
    assert Path(kept).read_bytes() == pylock.read_bytes()
    assert lines[-1] == "dry run: nothing installed; the commands above do it"
