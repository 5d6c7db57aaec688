"""``envbuilder conformance`` through a container: the image is built from the lock and the
suite runs inside it (CPU checks here: this machine has no GPU, so ``--allow-cpu``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from envbuilder.docker.cache import WheelCache
from envbuilder.model import load_resolution
from tests.docker.conftest import TORCH_ID

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "envbuilder" / "schemas" / "results.schema.json").read_text())


def conformance(locks: Path, out_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder",
            "conformance",
            TORCH_ID,
            "--locks",
            str(locks),
            "--out-dir",
            str(out_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=1800,
        check=False,
    )


def test_the_suite_runs_inside_the_combination_s_image(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    out_dir.chmod(0o755)  # the image's user could not write here: the command copies for it
    earlier = out_dir / "py3.11-other.json"
    earlier.write_text("{}", encoding="utf-8")

    done = conformance(
        torch_locks, out_dir, "--allow-cpu", "--quick",
        "--checks", "environment.versions", "--checks", "attention.sdpa.none",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    written = out_dir / f"{TORCH_ID}.json"
    assert done.stdout.split() == [str(written)]
    results = json.loads(written.read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(results)
    resolved = load_resolution(torch_locks / "resolution.json").by_id()[TORCH_ID]
    assert results["combination"] == TORCH_ID
    assert (
        results["lock_sha256"] == resolved.lock_sha256
    )  # bound to the lock the image was built from
    assert results["runner"]["torch"] == "2.13.0+cpu"  # the image's torch, not this interpreter's
    assert results["runner"]["gpus"] == []
    checks = {c["name"]: c for c in results["checks"]}
    assert checks["environment.versions"]["status"] == "pass"
    for case in ("attention.sdpa.none.fp32.forward", "attention.sdpa.none.fp32.backward"):
        assert checks[case]["status"] == "pass"
        assert checks[case]["numbers"]["cases"] > 0
        assert checks[case]["numbers"]["sensitivity_ratio"] >= 4  # it could have failed
    streamed = (out_dir / f"{TORCH_ID}.json.jsonl").read_text().splitlines()
    assert {json.loads(line)["name"] for line in streamed} == set(checks)
    assert earlier.read_text() == "{}"  # other runs' results are left alone
    assert list(Path(os.environ.get("TMPDIR", "/tmp")).glob("envbuilder-results-*")) == []


def test_without_a_gpu_the_container_run_says_what_is_missing(
    docker_client: Any, torch_locks: Path, tmp_path: Path
) -> None:
    runtimes = docker_client.info().get("Runtimes", {}) or {}
    if shutil.which("nvidia-smi") or "nvidia" in runtimes:
        pytest.skip("this machine has a GPU for containers")
    done = conformance(torch_locks, tmp_path / "results", "--quick")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "no GPU for containers" in done.stderr
    assert "--allow-cpu" in done.stderr
    assert not (tmp_path / "results" / f"{TORCH_ID}.json").exists()


def test_a_container_that_writes_no_results_fails_the_command_and_keeps_earlier_ones(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    earlier = out_dir / f"{TORCH_ID}.json"
    earlier.write_text('{"earlier": true}\n', encoding="utf-8")
    (out_dir / f"{TORCH_ID}.json.jsonl").write_text("{}\n", encoding="utf-8")

    done = conformance(torch_locks, out_dir, "--allow-cpu", "--checks", "attention.sdpz")

    assert done.returncode == 1, done.stderr[-3000:]
    assert "no check matches --checks attention.sdpz" in done.stderr  # the suite's own words
    assert f"suite did not complete for: {TORCH_ID} (exit status 2, no results written)" in (
        done.stderr
    )
    assert done.stdout == ""
    assert earlier.read_text(encoding="utf-8") == '{"earlier": true}\n'
    assert (out_dir / f"{TORCH_ID}.json.jsonl").read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in out_dir.iterdir()) == [
        f"{TORCH_ID}.json",
        f"{TORCH_ID}.json.jsonl",
    ]
