"""A ``-cudart`` combination's runtime path: prepended to ``LD_LIBRARY_PATH`` (never replacing
it) by ``install``, dry run included, and named by ``doctor`` when the extension does not load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.doctor import Installed, check_environment
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
        f"export LD_LIBRARY_PATH='{site}/nvidia/cuda_runtime/lib'"
        '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
    ) in err


def _extension_finding(compat: CompatLock, prefix: Path) -> str:
    entry = compat.by_id()[CUDART]
    env = Installed(
        python="3.12",
        versions={p.name: p.version or "" for p in entry.packages},
        prefix=str(prefix),
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
    return found.detail


def test_doctor_names_the_runtime_path_when_the_extension_does_not_load(
    compat: CompatLock, tmp_path: Path
) -> None:
    libdir = tmp_path / "env" / "lib" / "python3.12" / "site-packages" / "nvidia" / "cuda_runtime"
    (libdir / "lib").mkdir(parents=True)
    detail = _extension_finding(compat, tmp_path / "env")
    assert f'LD_LIBRARY_PATH="{libdir}/lib' in detail


def test_doctor_says_the_runtime_is_missing_rather_than_a_path_that_is_not_there(
    compat: CompatLock, tmp_path: Path
) -> None:
    detail = _extension_finding(compat, tmp_path / "env")
    assert "LD_LIBRARY_PATH" not in detail
    assert "nvidia-cuda-runtime-cu12" in detail and "is not installed here" in detail
    assert f"`envbuilder install {CUDART}` installs it" in detail


def test_the_dry_run_says_which_mechanism_finds_the_runtime(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["install", CUDART, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"runtime path: {CUDART} will find its added CUDA runtime" in err
    assert "prepend it on activation (deactivate restores it)" in err
    assert not (workdir / "venv" / "bin" / "activate").exists()  # a dry run writes nothing


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A real venv (no pip), its activate scripts as the standard library writes them."""
    import venv as stdlib_venv

    stdlib_venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "env")
    return tmp_path / "env"


LIBDIR = "/env/lib/python3.12/site-packages/nvidia/cuda_runtime/lib"


def test_every_activate_script_of_a_venv_is_hooked_once(venv: Path) -> None:
    from envbuilder.consumer.runtime_path import BEGIN, hook_environment, unhook_text

    before = {
        n: (venv / "bin" / n).read_text() for n in ("activate", "activate.fish", "activate.csh")
    }
    hook = hook_environment(venv, LIBDIR)
    assert hook is not None
    assert sorted(f.name for f in hook.files) == sorted(before)
    hook_environment(venv, LIBDIR)  # installing again replaces the hook
    for name, text in before.items():
        hooked = (venv / "bin" / name).read_text()
        # csh: if set (non-empty or empty) / unset; fish: non-empty / else
        assert hooked.count(LIBDIR) == {"activate.csh": 3, "activate.fish": 2}.get(name, 1), name
        assert hooked.count(BEGIN) == (1 if name == "activate.csh" else 2), name
        assert unhook_text(hooked) == text, name  # nothing else changed
    csh = (venv / "bin" / "activate.csh").read_text()
    assert "alias deactivate 'test $?_ENVBUILDER_OLD_LD_LIBRARY_PATH != 0 && setenv" in csh
    # what an earlier install wrote is taken out too when installing again
    from envbuilder.consumer.runtime_path import _CSH_REVERT, _CSH_REVERT_BEFORE

    assert unhook_text(csh.replace(_CSH_REVERT, _CSH_REVERT_BEFORE)) == before["activate.csh"]


def test_a_conda_environment_gets_activate_d_scripts(tmp_path: Path) -> None:
    from envbuilder.consumer.runtime_path import hook_environment

    (tmp_path / "conda-meta").mkdir()
    hook = hook_environment(tmp_path, LIBDIR)
    assert hook is not None and "activate.d/deactivate.d" in hook.mechanism
    on, off = hook.files
    assert on == tmp_path / "etc/conda/activate.d/envbuilder-cuda-runtime.sh"
    assert (
        f"export LD_LIBRARY_PATH='{LIBDIR}'\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\""
        in on.read_text()
    )
    assert "unset LD_LIBRARY_PATH" in off.read_text()


def test_an_environment_without_activation_gets_none(tmp_path: Path) -> None:
    from envbuilder.consumer.runtime_path import hook_environment

    assert hook_environment(tmp_path, LIBDIR) is None
    assert list(tmp_path.iterdir()) == []
