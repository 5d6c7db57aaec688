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
from envbuilder.docker.plan import image_tag
from envbuilder.model import load_resolution
from tests.docker.conftest import DIFFUSERS_VERSION, TORCH_ID

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


#: One compiled check of each kind that exists on the CPU (attention masks forward and
#: backward under torch.compile, dropout compiled) and the model group (diffusers, from the
#: image's suite layer).
COMPILED_AND_MODEL = (
    "compile.sdpa.causal.dynamic.fullgraph.fp32.*",
    "compile.sdpa.bias.dynamic.fullgraph.fp32.*",
    "compile.sdpa.padding.dynamic.fullgraph.fp32.*",
    "compile.sdpa.dropout",
    "model.diffusers.qwenimage.sdpa.*",
)


def test_compiled_checks_and_the_model_group_pass_on_the_cpu_in_the_image(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    selection = [a for pattern in COMPILED_AND_MODEL for a in ("--checks", pattern)]

    done = conformance(torch_locks, out_dir, "--allow-cpu", *selection)

    assert done.returncode in (0, 1), done.stderr[-4000:]  # 1: a gate failed, results written
    results = json.loads((out_dir / f"{TORCH_ID}.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(results)
    checks = {c["name"]: c for c in results["checks"]}
    outcome = {name: (c["status"], c.get("reason", "")[:300]) for name, c in checks.items()}
    compiled = [n for n in checks if n.startswith("compile.sdpa.")]
    model = [n for n in checks if n.startswith("model.")]
    assert len(compiled) == 3 * 2 + 1, outcome  # three masks forward and backward, dropout
    assert len(model) == 4, outcome  # inference and training, eager and compiled
    # every compiled check passes; the model group runs (diffusers is in the image) and
    # its verdicts are the suite's to give: none fails or skips for want of a compiler
    assert {n: outcome[n][0] for n in compiled} == dict.fromkeys(compiled, "pass"), outcome
    assert {outcome[n][0] for n in model} <= {"pass", "fail"}, outcome
    assert outcome["model.diffusers.qwenimage.sdpa.training.eager"][0] == "pass", outcome
    assert outcome["model.diffusers.qwenimage.sdpa.inference.compiled"][0] == "pass", outcome
    environment = ("CppCompileError", "C++ compiler", "C compiler", "Python.h", "not installed")
    assert not [n for n, (_, why) in outcome.items() if any(e in why for e in environment)], outcome
    runner = results["runner"]  # the compiler the image gives triton and inductor
    assert runner["cc"] == "gcc"  # by name: the runner's directories are not a finding
    assert runner["cc_version"].startswith("gcc (Debian 12.")
    assert runner["cxx_version"].startswith("g++ (Debian 12.")
    image = docker_client.images.get(
        image_tag(
            TORCH_ID,
            load_resolution(torch_locks / "resolution.json").by_id()[TORCH_ID].lock_sha256 or "",
        )
    )
    # the label records `cc --version`, the runner `gcc --version`: one compiler, two names
    label = image.labels["io.envbuilder.compiler.cc"]
    assert label.split(" ", 1)[1] == runner["cc_version"].split(" ", 1)[1], (label, runner)
    assert image.labels["io.envbuilder.suite.diffusers"] == DIFFUSERS_VERSION
