"""``envbuilder repro`` end to end on CPU: the real suite writes a results file, the command
writes a script, and the script runs in a fresh interpreter that cannot import envbuilder.

A passing case (attention, compiled, a diffusers mask form) prints NOT REPRODUCED with the
worst error the suite recorded. A failure is planted honestly: a ``sitecustomize`` gives
torch an SDPA that drops its mask, one that casts a boolean mask with ``.type_as`` (reached
through diffusers' native backend), or one dynamo must break the graph at; the suite run
under it records the failure, and the script run under it reproduces that failure and says
so, while the same script without it passes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (the tests nox session installs torch==2.13.0)",
)

ATTENTION = "attention.sdpa.padding.fp32.backward"
COMPILED = "compile.sdpa.causal.static.fullgraph.fp32.forward"
MASKS = "masks.native.bool4d_b1mn.fp32"
#: the masks checks go through diffusers' attention dispatch: without it they skip
NEEDS_DIFFUSERS = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None,
    reason="diffusers is not installed (the masks group and its reproducer need it)",
)

#: a torch whose SDPA ignores attn_mask: padding is attended to
DROPS_THE_MASK = """
import torch.nn.functional as F
_sdpa = F.scaled_dot_product_attention
def _no_mask(q, k, v, attn_mask=None, *args, **kwargs):
    return _sdpa(q, k, v, None, *args, **kwargs)
F.scaled_dot_product_attention = _no_mask
"""
#: a torch whose SDPA turns a boolean mask into an additive one with ``.type_as``
#: (True -> +1.0, False -> 0.0: masked keys are attended), the misreading diffusers 0.42.1's
#: xformers backend makes, here reached through diffusers' native backend
CASTS_A_BOOL_MASK = """
import torch
import torch.nn.functional as F
_sdpa = F.scaled_dot_product_attention
def _cast(query, key, value, attn_mask=None, *args, **kwargs):
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = attn_mask.type_as(query)
    return _sdpa(query, key, value, attn_mask, *args, **kwargs)
F.scaled_dot_product_attention = _cast
"""
#: a torch whose SDPA dynamo cannot trace in one graph
BREAKS_THE_GRAPH = """
import torch
import torch.nn.functional as F
_sdpa = F.scaled_dot_product_attention
def _breaking(*args, **kwargs):
    torch._dynamo.graph_break()
    return _sdpa(*args, **kwargs)
F.scaled_dot_product_attention = _breaking
"""


def _env(*paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def _suite(out: Path, checks: list[str], *extra_path: Path) -> dict[str, dict[str, object]]:
    argv = [sys.executable, "-m", "envbuilder.conformance", "--out", str(out), "--device", "cpu"]
    for check in checks:
        argv += ["--checks", check]
    done = subprocess.run(
        argv, cwd=out.parent, env=_env(*extra_path, ROOT), capture_output=True, text=True
    )
    assert done.returncode in (0, 1), done.stderr  # 1: a gate check failed
    data = json.loads(out.read_text())
    return {c["name"]: c for c in data["checks"]}


def _repro(tmp: Path, check: str, results: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", "repro", check, "--results", str(results), *extra],
        cwd=tmp,
        env=_env(ROOT),
        capture_output=True,
        text=True,
    )


def _run_script(script: Path, *extra_path: Path) -> subprocess.CompletedProcess[str]:
    """In a fresh interpreter, from a directory without envbuilder, with only ``extra_path``."""
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=_env(*extra_path),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, object]]]:
    out = tmp_path_factory.mktemp("passing") / "cpu.json"
    return out, _suite(out, [ATTENTION, COMPILED, MASKS])


@pytest.mark.parametrize("check", [ATTENTION, COMPILED, pytest.param(MASKS, marks=NEEDS_DIFFUSERS)])
def test_a_passing_case_runs_standalone_and_is_not_reproduced(
    check: str, passing: tuple[Path, dict[str, dict[str, object]]], tmp_path: Path
) -> None:
    results, checks = passing
    assert checks[check]["status"] == "pass"
    refused = _repro(tmp_path, check, results, "-o", "x.py")
    assert refused.returncode == 1
    assert f"{check} did not fail in" in refused.stderr
    assert "--force" in refused.stderr
    assert not (tmp_path / "x.py").exists()

    made = _repro(tmp_path, check, results, "--force", "-o", str(tmp_path))
    assert made.returncode == 0, made.stderr
    script = tmp_path / f"repro_{check.replace('.', '_')}.py"
    ran = _run_script(script)  # no PYTHONPATH: envbuilder cannot be imported
    assert ran.returncode == 0, ran.stdout + ran.stderr
    last = ran.stdout.strip().splitlines()[-1]
    assert last.startswith(f"NOT REPRODUCED: {check} passes here (worst: ")
    numbers = checks[check]["numbers"]
    assert isinstance(numbers, dict)
    assert f"error {numbers['error']:.3g} <= bound {numbers['bound']:.3g}" in last


def test_a_planted_numeric_failure_is_reproduced(tmp_path: Path) -> None:
    broken = tmp_path / "broken_torch"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(DROPS_THE_MASK)
    results = tmp_path / "cpu.json"
    recorded = _suite(results, [ATTENTION], broken)[ATTENTION]
    assert recorded["status"] == "fail"

    made = _repro(tmp_path, ATTENTION, results, "-o", "repro.py")
    assert made.returncode == 0, made.stderr
    script = tmp_path / "repro.py"
    assert f"# Recorded:  fail: {str(recorded['reason']).split(' ')[0]}" in script.read_text()

    ran = _run_script(script, broken)
    lines = ran.stdout.strip().splitlines()
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert lines[-1].startswith(f"REPRODUCED: {ATTENTION}: fail: ")
    assert " > bound " in lines[-1]
    assert lines[-2].endswith(": the same failure")
    assert str(recorded["reason"]).split(";")[0] in lines[-1]

    fixed = _run_script(script)  # the same script on a torch that applies the mask
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.strip().splitlines()[-1].startswith(f"NOT REPRODUCED: {ATTENTION}")


@NEEDS_DIFFUSERS
def test_a_planted_mask_misreading_through_diffusers_is_reproduced(tmp_path: Path) -> None:
    broken = tmp_path / "broken_torch"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(CASTS_A_BOOL_MASK)
    results = tmp_path / "cpu.json"
    recorded = _suite(results, [MASKS], broken)[MASKS]
    assert recorded["status"] == "fail", recorded
    numbers = recorded["numbers"]
    assert isinstance(numbers, dict)

    assert _repro(tmp_path, MASKS, results, "-o", "repro.py").returncode == 0
    script = tmp_path / "repro.py"
    ran = _run_script(script, broken)
    lines = ran.stdout.strip().splitlines()
    assert ran.returncode == 1, ran.stdout + ran.stderr
    # the mask the script hands diffusers is the one the check handed it
    assert (
        f"mask handed to diffusers: {numbers['mask_shape']} bool, masked keys fraction"
        f" {numbers['masked_keys_fraction']} (recorded: {numbers['mask_shape']} bool" in ran.stdout
    )
    assert lines[-2].endswith(": the same failure")
    assert lines[-1] == f"REPRODUCED: {MASKS}: fail: {recorded['reason']}"

    fixed = _run_script(script)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.strip().splitlines()[-1].startswith(f"NOT REPRODUCED: {MASKS} passes")


def test_a_planted_compile_failure_prints_the_same_first_error_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken_torch"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(BREAKS_THE_GRAPH)
    results = tmp_path / "cpu.json"
    recorded = _suite(results, [COMPILED], broken)[COMPILED]
    assert recorded["status"] == "fail"
    first = str(recorded["reason"]).split(" | ")[0]
    assert first.startswith("compiled attention failed: ")

    assert _repro(tmp_path, COMPILED, results, "-o", "repro.py").returncode == 0
    ran = _run_script(tmp_path / "repro.py", broken)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == f"REPRODUCED: {COMPILED}: fail: {first}"
    assert "Traceback" in ran.stderr  # the whole error, for an upstream report


def test_an_unknown_check_exits_2_with_a_suggestion(
    passing: tuple[Path, dict[str, dict[str, object]]], tmp_path: Path
) -> None:
    results, _ = passing
    typo = ATTENTION.replace("padding", "paddng")
    done = _repro(tmp_path, typo, results)
    assert done.returncode == 2
    assert f"did you mean {ATTENTION!r}?" in done.stderr
    assert done.stdout == ""
