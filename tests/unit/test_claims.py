"""A results file is evidence only for the environment it recorded: each contradiction between
its findings and its combination is named, and `lock` rejects the file for it."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuilder.aggregate.claims import claim_problems
from envbuilder.cli import main
from envbuilder.model import load_resolution

DATA = Path(__file__).parents[1] / "data"
CUDART = "py3.12-default-torch2.7.0-xformers0.0.30-cudart"
GOOD = json.loads((DATA / "results" / f"{CUDART}.h100.json").read_text())
COMBOS = load_resolution(DATA / "locks" / "resolution.json").by_id()
LOCKED = {"torch": "2.7.0", "xformers": "0.0.30", "nvidia-cuda-runtime-cu12": "12.8.90"}


def runner(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["runner"].update(changes)

    return change


def gpu(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["runner"]["gpus"][0].update(changes)

    return change


def installed(**versions: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["checks"].append(
            {"name": "environment.versions", "group": "environment", "numbers": versions}
        )

    return change


def relabelled(data: dict[str, Any]) -> None:
    data["combination"] = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (runner(python="3.11.10"), "Python 3.11.10, not 3.12"),
        (runner(torch="2.5.1+cu124"), "torch 2.5.1+cu124, not 2.7.0"),
        (runner(torch_cuda="11.8"), "torch's CUDA 11.8, not 12.4"),
        (runner(xformers="0.0.28.post3"), "xformers 0.0.28.post3, not 0.0.30"),
        (runner(platform="Linux-aarch64"), "not a x86_64 machine"),
        (gpu(compute_capability="8.0"), "a H100 is 9.0"),
        (runner(torch_cuda=None), "torch has no CUDA"),
        (runner(driver=None), "no NVIDIA driver"),
        (installed(nvidia_cuda_runtime_cu12="12.4.127"), "nvidia-cuda-runtime-cu12 12.4.127"),
        (installed(torch="2.7.1+cu124"), "torch 2.7.1+cu124 installed, the lock has 2.7.0"),
    ],
)
def test_each_contradiction_is_named(damage: Callable[[dict[str, Any]], None], said: str) -> None:
    data = copy.deepcopy(GOOD)
    damage(data)
    problems = claim_problems(data, COMBOS[CUDART], locked=LOCKED)
    assert any(said in p for p in problems), problems


@pytest.mark.parametrize(
    "agreeing",
    [
        runner(),  # as written
        installed(torch="2.7.0+cu124", numpy="1.26.0"),  # numpy is not the CUDA chain
        runner(xformers=None),  # xformers failed to import: a finding, not a contradiction
        runner(gpus=[], driver=None),  # a CPU run of a CUDA combination: GPU checks skip
    ],
)
def test_what_agrees_is_accepted(agreeing: Callable[[dict[str, Any]], None]) -> None:
    data = copy.deepcopy(GOOD)
    agreeing(data)
    assert claim_problems(data, COMBOS[CUDART], locked=LOCKED) == []


def test_the_synthetic_results_agree_with_their_combinations() -> None:
    for path in sorted((DATA / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert claim_problems(data, COMBOS[data["combination"]]) == [], path.name


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (relabelled, "is not that of 'py3.11-default-torch2.5.1-xformers0.0.28.post3'"),
        (gpu(name="NVIDIA H200", compute_capability="8.6"), "a H200 is 9.0"),
        (runner(torch="2.7.0+cpu", torch_cuda=None), "torch has no CUDA"),
    ],
    ids=["another-combinations-run", "inconsistent-gpu", "cpu-machine-claiming-a-gpu"],
)
def test_lock_rejects_a_file_whose_environment_is_not_its_combinations(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[dict[str, Any]], None],
    said: str,
) -> None:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    data = copy.deepcopy(GOOD)
    damage(data)
    if data["combination"] != CUDART:
        data["lock_sha256"] = COMBOS[data["combination"]].lock_sha256
    (tmp_path / "forged.json").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert main(["lock", "--resolution", "locks/resolution.json", "--results", "forged.json"]) == 2
    err = capsys.readouterr().err
    assert "its environment is not that of" in err and said in err
