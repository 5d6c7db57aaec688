"""The scripts ``envbuilder repro`` writes, run as users run them: from a directory without
envbuilder or results, in a fresh interpreter, on this machine without a GPU.

The GPU causes must say they cannot run here (exit 2), never that they reproduced; the
causal one fails while dynamo traces, so it runs on the CPU and exits as the committed
results say (1: reproduced). Stand-in packages put ahead on ``PYTHONPATH`` show the other
exits: a missing package (2), and an xformers whose mask object traces (0).
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
PLAIN = ROOT / "results" / "py3.12-cu130-torch2.11.0-xformers0.0.35.h200.json"
NEEDS_XFORMERS = pytest.mark.skipif(
    importlib.util.find_spec("xformers") is None, reason="xformers is not installed here"
)

#: one check of each cause, and the script's name
CAUSES = {
    "masks.xformers.bool4d_b11n.fp16": "repro_diffusers_xformers_bool_mask.py",
    "compile.xformers.bias.static.fullgraph.fp16.backward": "repro_xformers_compiled_bias_backward.py",
    "compile.xformers.causal.static.fullgraph.fp16.forward": "repro_xformers_causal_fullgraph.py",
}

#: an xformers whose causal mask object is a plain class dynamo traces, its attention SDPA
TRACEABLE_XFORMERS = {
    "xformers/__init__.py": "__version__ = '0.0.0+stand-in'\n",
    "xformers/ops.py": (
        "import torch\n"
        "class LowerTriangularMask:\n"
        "    pass\n"
        "def memory_efficient_attention(q, k, v, attn_bias=None):\n"
        "    causal = isinstance(attn_bias, LowerTriangularMask)\n"
        "    out = torch.nn.functional.scaled_dot_product_attention(\n"
        "        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)\n"
        "    return out.transpose(1, 2)\n"
    ),
}
#: an xformers whose attention fails another way: not the recorded failure, not a pass
FAILING_XFORMERS = {
    "xformers/__init__.py": "__version__ = '0.0.0+stand-in'\n",
    "xformers/ops.py": (
        "class LowerTriangularMask:\n"
        "    pass\n"
        "def memory_efficient_attention(q, k, v, attn_bias=None):\n"
        "    raise NotImplementedError('No operator found for `memory_efficient_attention`')\n"
    ),
}
NO_DIFFUSERS = {
    "diffusers/__init__.py": "raise ImportError('stand-in', name='diffusers')\n",
}


def _env(*paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def _stand_in(where: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    return where


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each cause's script, written from a consumer's directory (no results/ there) from
    the lockfile snapshot envbuilder carries."""
    here = tmp_path_factory.mktemp("consumer")
    for check, filename in CAUSES.items():
        done = subprocess.run(
            [sys.executable, "-m", "envbuilder", "repro", check, "-o", str(here) + os.sep],
            cwd=here,
            env=_env(ROOT),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        assert (here / filename).is_file(), done.stderr
    return here


def _run(script: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=_env(*paths),
        capture_output=True,
        text=True,
        timeout=300,
    )


@NEEDS_XFORMERS
@pytest.mark.parametrize(
    "filename",
    ["repro_diffusers_xformers_bool_mask.py", "repro_xformers_compiled_bias_backward.py"],
)
def test_a_gpu_cause_cannot_run_here(scripts: Path, filename: str) -> None:
    done = _run(scripts / filename)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("torch ")  # the versions, first
    assert "GPU none, driver none" in done.stdout
    assert done.stdout.rstrip().endswith(
        "cannot run this case here: no CUDA GPU visible to torch, and xformers' kernels run"
        " on CUDA only"
    )
    assert "REPRODUCED" not in done.stdout


@NEEDS_XFORMERS
def test_the_causal_cause_runs_on_the_cpu_as_the_results_say(scripts: Path) -> None:
    done = _run(scripts / "repro_xformers_causal_fullgraph.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "running on the CPU" in done.stdout
    assert "actual:   Unsupported: torch.* op returned non-Tensor" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("REPRODUCED: ")


@NEEDS_XFORMERS  # the script imports xformers before diffusers
def test_a_missing_package_cannot_run(scripts: Path, tmp_path: Path) -> None:
    done = _run(
        scripts / "repro_diffusers_xformers_bool_mask.py", _stand_in(tmp_path, NO_DIFFUSERS)
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == "cannot run this case here: diffusers is not installed"


def test_a_mask_object_that_traces_is_not_reproduced(scripts: Path, tmp_path: Path) -> None:
    done = _run(
        scripts / "repro_xformers_causal_fullgraph.py", _stand_in(tmp_path, TRACEABLE_XFORMERS)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "xformers 0.0.0+stand-in" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[-3] == "expected: largest |output - float64 reference| <= 0.05"
    assert float(lines[-2].split()[-1]) < 0.05
    assert lines[-1] == "NOT REPRODUCED: LowerTriangularMask() traces with fullgraph=True"


def test_another_error_is_no_reproduction(scripts: Path, tmp_path: Path) -> None:
    done = _run(
        scripts / "repro_xformers_causal_fullgraph.py", _stand_in(tmp_path, FAILING_XFORMERS)
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot run this case here: another error stopped the case first (cpu)" in done.stdout
    assert "REPRODUCED" not in done.stdout


def test_repro_refuses_a_suite_error_from_a_consumer_directory(tmp_path: Path) -> None:
    """Run as a user would, from a directory with no checkout: a check that errored in the
    suite's own code (as suite 2.1.0's gradient concatenation did) is never a reproducer."""
    check = "model.diffusers.qwenimage.xformers.training.compiled.dynamo_disable"
    plain = ROOT / "results" / "py3.12-cu130-torch2.11.0-xformers0.0.35.h200.json"
    data = json.loads(plain.read_text())
    for c in data["checks"]:
        if c["name"] == check:
            c |= {"status": "error", "reason": "RuntimeError: size mismatch (at checks_model.py:1)"}
            c["numbers"] = {"fault_component": "suite", "fault_evidence": "raised in the suite"}
    (tmp_path / plain.name).write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "envbuilder", "repro", check, "--results", plain.name],
        cwd=tmp_path,
        env=_env(ROOT),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "errored in envbuilder's own conformance code" in done.stderr
    assert not done.stdout
