"""A ``-cudart`` combination's runtime path: prepended to ``LD_LIBRARY_PATH`` (never replacing
it) by ``install``, dry run included, and named by ``doctor`` when the extension does not load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.doctor import Installed, check_environment
from envbuilder.lockfile.model import CompatLock

DATA = Path(__file__).parents[1] / "data"
CUDART = "py3.12-default-torch2.7.0-xformers0.0.30-cudart"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic lockfile here, and an active Python 3.12 venv as its files show it."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(argv) == 0
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nversion = 3.12.4\n")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_the_dry_run_says_the_runtime_path_prepended(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["install", CUDART, "--dry-run"]) == 0
    err = capsys.readouterr().err
    site = workdir / "venv" / "lib" / "python3.12" / "site-packages"
    assert (
        f'export LD_LIBRARY_PATH="{site}/nvidia/cuda_runtime/lib'
        '${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    ) in err


def test_doctor_names_the_runtime_path_when_the_extension_does_not_load(
    compat: CompatLock,
) -> None:
    entry = compat.by_id()[CUDART]
    env = Installed(
        python="3.12",
        versions={p.name: p.version or "" for p in entry.packages},
        prefix="/home/me/env",
    )
    probe = {
        "torch": entry.torch,
        "xformers": {"error": "libcudart.so.12: cannot open shared object file"},
        "cuda_available": False,
    }
    _, findings = check_environment(compat, env=env, probe=probe, hashes=False)
    (found,) = [f for f in findings if f.name == "xformers-extension"]
    assert found.status == "fail"
    assert found.detail.startswith("libcudart.so.12: cannot open shared object file; ")
    assert 'LD_LIBRARY_PATH="/home/me/env/lib/python3.12/site-packages/nvidia/' in found.detail
