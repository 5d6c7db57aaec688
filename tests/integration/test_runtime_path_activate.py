"""A ``-cudart`` lock's runtime directory is on ``LD_LIBRARY_PATH`` once the venv is activated,
prepended to what was there, and ``deactivate`` puts back exactly what was there (or unsets
it): real venvs, real shells (bash always; fish and tcsh where installed)."""

from __future__ import annotations

import shutil
import subprocess
import venv as stdlib_venv
from pathlib import Path

import pytest

from envbuilder.lockfile.runtime_path import hook_environment

LIBDIR = "/opt/cu12/lib"


@pytest.fixture
def env(tmp_path: Path) -> Path:
    stdlib_venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "env")
    assert hook_environment(tmp_path / "env", LIBDIR) is not None
    return tmp_path / "env"


def _shell(argv: list[str], script: str, old: str | None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    if old is not None:
        env["LD_LIBRARY_PATH"] = old
    proc = subprocess.run(
        [*argv, script], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    return proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("old", "during", "after"),
    [
        (None, LIBDIR, "<unset>"),
        ("", LIBDIR, ""),
        ("/usr/local/cuda/lib64", f"{LIBDIR}:/usr/local/cuda/lib64", "/usr/local/cuda/lib64"),
    ],
    ids=["unset", "empty", "set"],
)
def test_bash_activate_prepends_and_deactivate_restores(
    env: Path, old: str | None, during: str, after: str
) -> None:
    script = (
        f'. {env}/bin/activate; echo "${{LD_LIBRARY_PATH-<unset>}}"; '
        f'. {env}/bin/activate; echo "${{LD_LIBRARY_PATH-<unset>}}"; '  # again: no doubling
        'deactivate; echo "${LD_LIBRARY_PATH-<unset>}"'
    )
    assert _shell(["bash", "-c"], script, old) == [during, during, after]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_activate_prepends_and_deactivate_restores(env: Path) -> None:
    script = (
        f"source {env}/bin/activate.fish; echo $LD_LIBRARY_PATH; deactivate; echo $LD_LIBRARY_PATH"
    )
    assert _shell(["fish", "-c"], script, "/a") == [f"{LIBDIR} /a", "/a"]


@pytest.mark.skipif(shutil.which("tcsh") is None, reason="tcsh is not installed")
def test_csh_activate_prepends_and_deactivate_restores(env: Path) -> None:
    # one command per line: csh expands an alias only on lines after the one defining it;
    # an interactive csh has a prompt, which the stock activate.csh reads
    script = "\n".join(
        [
            'set prompt="> "',
            f"source {env}/bin/activate.csh",
            "echo $LD_LIBRARY_PATH",
            "deactivate",
            "echo $LD_LIBRARY_PATH",
        ]
    )
    assert _shell(["tcsh", "-f", "-c"], script, "/a") == [f"{LIBDIR}:/a", "/a"]
