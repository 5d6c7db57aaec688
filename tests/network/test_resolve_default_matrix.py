"""The repository's ``matrix.toml`` rows that issue 2 names, resolved against the real index.

The default index comes from pip's configuration; one CLI run resolves all
four rows (torch's and xformers' evidence through range reads, uv for the
closures), so the whole module stays well under a minute.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from envbuilder import cli
from envbuilder.errors import MissingToolError
from envbuilder.resolve.closure import find_uv

MATRIX = Path(__file__).resolve().parents[2] / "matrix.toml"

RESOLVED_CU121 = "py3.11-cu121-torch2.4.1-xformers0.0.28.post1"
PIN_MISMATCH = "py3.11-cu124-torch2.6.0-xformers0.0.26.post1"
SOURCE_BUILD = "py3.12-cu130-torch2.11.0-xformers0.0.35"
WITH_RUNTIME = "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    try:
        find_uv()
    except MissingToolError as e:
        pytest.skip(f"uv is needed for closures: {e}")
    tmp = tmp_path_factory.mktemp("resolve-default")
    out = tmp / "locks"
    capture = tmp / "stdout.json"
    argv = [
        "resolve",
        RESOLVED_CU121,
        PIN_MISMATCH,
        SOURCE_BUILD,
        WITH_RUNTIME,
        "--matrix", str(MATRIX),
        "--out", str(out),
        "--cache-dir", str(tmp / "cache"),
        "--json",
    ]  # fmt: skip
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = cli.main(argv)
    capture.write_text(buffer.getvalue(), encoding="utf-8")
    doc = json.loads(buffer.getvalue())
    return rc, {c["combination"]["id"]: c for c in doc["combinations"]}, out


def test_the_run_succeeds_and_reports_exactly_the_selected_rows(
    run: tuple[int, dict[str, Any], Path],
) -> None:
    rc, results, _ = run
    assert rc == 0
    assert {cid: r["status"] for cid, r in results.items()} == {
        RESOLVED_CU121: "resolved",
        PIN_MISMATCH: "unsatisfiable",
        SOURCE_BUILD: "resolved",
        WITH_RUNTIME: "resolved",
    }


def test_torch_2_4_1_and_xformers_0_0_28_post1_are_both_cuda_12_1(
    run: tuple[int, dict[str, Any], Path],
) -> None:
    result = run[1][RESOLVED_CU121]
    assert result["torch"]["version"] == "2.4.1"
    assert (result["torch"]["cuda"], result["torch"]["cuda_source"]) == ("12.1", "requires-dist")
    assert result["xformers"]["built_with"]["cuda"] == "12.1"
    assert result["xformers"]["requires_torch"] == "==2.4.1"
    lock = tomllib.loads((run[2].parent / result["lock"]).read_text(encoding="utf-8"))
    versions = {p["name"]: p["version"] for p in lock["packages"]}
    assert versions["torch"] == "2.4.1"
    assert versions["xformers"] == "0.0.28.post1"
    assert versions["nvidia-cuda-runtime-cu12"] == "12.1.105"


def test_xformers_0_0_26_post1_pins_another_torch(run: tuple[int, dict[str, Any], Path]) -> None:
    result = run[1][PIN_MISMATCH]
    assert "torch==2.3.0" in result["reason"]
    assert result["lock"] is None


def test_xformers_0_0_35_is_built_from_its_sdist_for_cuda_13_0(
    run: tuple[int, dict[str, Any], Path],
) -> None:
    """Its wheel is a CUDA 12.8 build, torch 2.11.0 brings CUDA 13.0: the row locks the
    sdist and a build group with the CUDA 13.0 compiler wheels, all hash-pinned."""
    result = run[1][SOURCE_BUILD]
    assert result["reason"].startswith(
        "xformers 0.0.35 built from source for torch 2.11.0+cu130 (no wheel fits: "
    )
    assert "12.8" in result["reason"]
    assert result["torch"]["cuda"] == "13.0"
    build = result["source_build"]
    assert build["sdist"]["filename"] == "xformers-0.0.35.tar.gz"
    assert len(build["sdist"]["sha256"]) == 64 and build["sdist"]["size"] > 1_000_000
    assert build["arch_list"] == ["9.0"]
    lock_text = (run[2].parent / build["build_lock"]).read_text(encoding="utf-8")
    assert hashlib.sha256(lock_text.encode()).hexdigest() == build["build_lock_sha256"]
    packages = {p["name"]: p for p in tomllib.loads(lock_text)["packages"]}
    for name in ("nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-runtime"):
        assert packages[name]["version"].startswith("13.0.")
        assert len(packages[name]["wheels"][0]["hashes"]["sha256"]) == 64
    assert {"setuptools", "wheel", "ninja"} <= set(packages)
    assert "torch" not in packages  # the combination's own torch builds it
    main = tomllib.loads((run[2].parent / result["lock"]).read_text(encoding="utf-8"))
    versions = {p["name"]: p["version"] for p in main["packages"]}
    assert versions["torch"] == "2.11.0" and "numpy" in versions
    assert "xformers" not in versions and "nvidia-cuda-runtime-cu12" not in versions


def test_add_cuda_runtime_puts_the_cuda_12_8_runtime_in_the_lock(
    run: tuple[int, dict[str, Any], Path],
) -> None:
    result = run[1][WITH_RUNTIME]
    (runtime,) = result["extra_runtime"]
    assert runtime.startswith("nvidia-cuda-runtime-cu12==12.8.")
    lock = tomllib.loads((run[2].parent / result["lock"]).read_text(encoding="utf-8"))
    versions = {p["name"]: p["version"] for p in lock["packages"]}
    assert versions["nvidia-cuda-runtime-cu12"].startswith("12.8.")
    assert versions["torch"] == "2.11.0"
    assert versions["xformers"] == "0.0.35"


@pytest.mark.parametrize("cid", [RESOLVED_CU121, WITH_RUNTIME])
def test_the_suite_group_locks_diffusers_beside_the_lock_and_agrees_with_it(
    run: tuple[int, dict[str, Any], Path], cid: str
) -> None:
    result, root = run[1][cid], run[2].parent
    lock = tomllib.loads((root / result["lock"]).read_text(encoding="utf-8"))
    suite_path = root / result["suite_lock"]
    suite = tomllib.loads(suite_path.read_text(encoding="utf-8"))
    assert result["suite_lock_sha256"] == hashlib.sha256(suite_path.read_bytes()).hexdigest()
    assert suite["tool"]["envbuilder"]["lock-sha256"] == result["lock_sha256"]
    versions = {p["name"]: p["version"] for p in suite["packages"]}
    assert versions["diffusers"] == "0.42.1"
    assert {"huggingface-hub", "safetensors"} <= set(versions)
    # What both need (numpy, filelock) is the lock's, so it is not in the group again.
    assert not set(versions) & {p["name"] for p in lock["packages"]}
    assert all(len(w["hashes"]["sha256"]) == 64 for p in suite["packages"] for w in p["wheels"])
    requirements = (root / result["suite_requirements"]).read_text(encoding="utf-8")
    assert requirements.count("--hash=sha256:") == len(versions)
