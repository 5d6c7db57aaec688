"""``query --here`` on a machine whose ``nvidia-smi`` is a script on PATH: the detection
runs for real (a child process, the real command line), only the GPU is pretend."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None,
    reason="pynvml is importable: NVML, not the fake nvidia-smi, would answer",
)


def _fake_nvidia_smi(bin_dir: Path, stdout: str, status: int = 0) -> None:
    """An ``nvidia-smi`` that answers only the query `detect_host` asks."""
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"--query-gpu=name,compute_cap,driver_version --format=csv,noheader"*) ;;\n'
        '  *) echo "unexpected arguments: $*" >&2; exit 64 ;;\n'
        "esac\n"
        f"cat <<'EOF'\n{stdout}EOF\n"
        f"exit {status}\n",
        encoding="utf-8",
    )
    script.chmod(0o755)


@pytest.fixture
def lockfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main(argv) == 0
    return tmp_path / "compat.lock.json"


def _query_here(lockfile: Path, bin_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder",
            "query",
            "--here",
            "--lock",
            str(lockfile),
            "--python",
            sys.executable,
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the fixture locks are x86_64"
)
def test_query_here_reads_the_gpu_and_driver_from_nvidia_smi(
    lockfile: Path, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_nvidia_smi(bin_dir, "NVIDIA H100 80GB HBM3, 9.0, 545.23.06\n")
    proc = _query_here(lockfile, bin_dir, "--json")
    out = json.loads(proc.stdout)
    assert out["host"]["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]
    assert (out["host"]["driver"], out["host"]["source"]) == ("545.23.06", "nvidia-smi")
    assert (out["host"]["python"], out["host"]["arch"]) == (PYTHON, "x86_64")
    assert out["query"]["gpu"] == "9.0"
    # every fixture lock is CUDA 12.4 (full support from 550.54.14): this 12.3 driver runs
    # them by minor-version compatibility, each with a warning
    warned = {m["id"]: m["warnings"] for m in out["matches"]}
    resolved = [e for e in warned if "py3.13-default-torch2.4.1" not in e]
    assert resolved
    for combo in resolved:
        assert warned[combo] == [
            "driver 545.23.06 runs CUDA 12.x builds by NVIDIA's minor-version compatibility "
            "(from 525.60.13) unless PTX JIT is needed; recommended for CUDA 12.4: 550.54.14 "
            "or newer"
        ]

    # the same machine after a driver upgrade: its Python's combinations, best first
    _fake_nvidia_smi(bin_dir, "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\n")
    proc = _query_here(lockfile, bin_dir)
    lines = proc.stdout.splitlines()[1:]  # after the interpreter's line
    assert lines[0] == (
        f"this machine: Python {PYTHON}, x86_64, NVIDIA H100 80GB HBM3 (sm_90), "
        "driver 550.54.15 (from nvidia-smi)"
    )
    if PYTHON == "3.11":
        assert proc.returncode == 0
        assert lines[1].startswith("verdicts (the worst of the four uses): ")
        assert lines[2].split()[:2] == [
            "verified",
            "py3.11-default-torch2.5.1-xformers0.0.28.post3",
        ]
        assert any(line.endswith(": Python 3.12, not 3.11") for line in lines)


def test_query_here_says_why_there_is_no_gpu(lockfile: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_nvidia_smi(
        bin_dir,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        status=9,
    )
    proc = _query_here(lockfile, bin_dir, "--json")
    host = json.loads(proc.stdout)["host"]
    assert host["gpus"] == []
    assert host["note"] == (
        "nvidia-smi exited with status 9: NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver."
    )
