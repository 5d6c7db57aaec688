"""A check group is one module plus one registry entry: a toy group registered at run
time runs through the real runner on the CPU, forked from the real fork server, split
across processes by its units and their measured costs."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from envbuilder.conformance.forkserver import PRELOAD_VARIABLE
from envbuilder.conformance.groups import GroupSpec, registered
from envbuilder.conformance.runner import RunOptions, pattern_problems, run_suite

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (the tests nox session installs torch==2.13.0)",
)

TOY_MODULE = '''
"""A toy check group: each check reports the process it ran in."""

import os

from envbuilder.conformance._record import CheckSpec, Outcome

NAMES = ("toy.alpha.one", "toy.alpha.two", "toy.beta.one", "toy.gamma.one", "toy.gamma.two")


def _run(name):
    return Outcome.passed({"pid": os.getpid(), "name": name})


def specs(ctx):
    return [CheckSpec(name=n, gate=False, run=lambda n=n: _run(n)) for n in NAMES]
'''

TOY = GroupSpec(
    name="toy",
    module="envbuilder_toy_checks",
    timeout_s=120,
    quick_timeout_s=120,
    shard_unit_parts=2,  # toy.<unit>: alpha, beta, gamma
)


@pytest.fixture
def toy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "envbuilder_toy_checks.py").write_text(TOY_MODULE, encoding="utf-8")
    path = os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv(PRELOAD_VARIABLE, "torch")  # the fork server imports torch only
    return folder


def test_a_registered_group_runs_through_the_real_runner(toy_module: Path, tmp_path: Path) -> None:
    assert pattern_problems(["toy"])  # not a group before it is registered
    table = {"toy.alpha": 5.0, "toy.beta": 1.0, "toy.gamma": 3.0}
    out = tmp_path / "toy.json"
    lines: list[str] = []
    with registered(TOY):
        assert pattern_problems(["toy"]) == []
        results = run_suite(
            RunOptions(
                out=out, checks=("toy",), device="cpu", jobs=2, parts={"toy": 2}, costs=table
            ),
            echo=lines.append,
        )
    assert pattern_problems(["toy"])  # gone again after the block
    written = json.loads(out.read_text(encoding="utf-8"))
    names = [c["name"] for c in written["checks"]]
    assert names == [
        "toy.alpha.one",
        "toy.alpha.two",
        "toy.beta.one",
        "toy.gamma.one",
        "toy.gamma.two",
    ]  # in plan order, though two processes ran them
    assert {c.status for c in results.checks} == {"pass"}
    pid = {c["name"]: c["numbers"]["pid"] for c in written["checks"]}
    # longest first: alpha (5) alone, gamma (3) and beta (1) together
    assert pid["toy.alpha.one"] == pid["toy.alpha.two"]
    assert pid["toy.gamma.one"] == pid["toy.gamma.two"] == pid["toy.beta.one"]
    assert pid["toy.alpha.one"] != pid["toy.beta.one"]
    assert written["runner"]["launch"]["parts"] == {"toy": 2}
    assert written["runner"]["launch"]["fork_server"] is True
    assert any(line.startswith("▶ toy (2 processes)") for line in lines), lines
