"""The suite on CPU with a real torch: CPU checks run (SDPA and the math path over every
mask kind, eager and compiled, forward and backward; dropout; the diffusers model's
training step and the mask forms through diffusers' dispatch where diffusers is installed), GPU checks skip with a reason, and a
crash or a hang in one check loses nothing else (fault injection)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from envbuilder.conformance.runner import RunOptions, run_suite
from envbuilder.conformance.worker import FAULT_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
#: a real shared library to load under the CUDA driver's name
LIBZ = (Path("/lib/x86_64-linux-gnu/libz.so.1"), Path("/usr/lib/x86_64-linux-gnu/libz.so.1"))
SCHEMA = json.loads((ROOT / "envbuilder" / "schemas" / "results.schema.json").read_text())

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (the tests nox session installs torch==2.13.0)",
)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a machine with a GPU
    env.update(extra)
    return env


def _suite(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m envbuilder.conformance ARGS`` on the CPU path, from the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "envbuilder.conformance", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("conformance") / "results.json"
    proc = _suite(
        "--quick",
        "--out",
        str(out),
        "--combination",
        "py3.11-cpu-torch2.13.0",
        "--checks",
        "environment",
        "--checks",
        "attention",
        "--checks",
        "compile.sdpa",
        "--checks",
        "model",
        "--checks",
        "masks",
        "--checks",
        "performance",
        "--checks",
        "multigpu",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), out, proc.stdout


def test_results_follow_the_schema(quick_run: tuple[dict[str, Any], Path, str]) -> None:
    results, _, _ = quick_run
    jsonschema.Draft202012Validator(SCHEMA).validate(results)
    assert results["combination"] == "py3.11-cpu-torch2.13.0"
    assert results["runner"]["gpus"] == []


def test_jsonl_stream_holds_every_check(quick_run: tuple[dict[str, Any], Path, str]) -> None:
    results, out, _ = quick_run
    lines = [
        json.loads(line) for line in out.with_name(out.name + ".jsonl").read_text().splitlines()
    ]
    assert [line["name"] for line in lines] == [c["name"] for c in results["checks"]]


def _checks(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in results["checks"]}


def _measured_and_sensitive(check: dict[str, Any]) -> None:
    """A numeric check that passed: within its bound, and able to see its wrong answer."""
    assert check["status"] == "pass", check["reason"]
    numbers = check["numbers"]
    assert numbers["error"] <= numbers["bound"]
    assert numbers["sensitivity_ratio"] >= 4
    assert numbers["sensitivity_ratio"] == pytest.approx(
        numbers["sensitivity"] / numbers["bound"], rel=1e-3
    )


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize(
    "mask", ["none", "causal", "blockdiag", "bias", "padding", "bias_expanded"]
)
def test_sdpa_is_checked_for_real_on_cpu(
    quick_run: tuple[dict[str, Any], Path, str], mask: str, dtype: str, mode: str
) -> None:
    check = _checks(quick_run[0])[f"attention.sdpa.{mask}.{dtype}.{mode}"]
    _measured_and_sensitive(check)
    assert check["numbers"]["cases"] >= 2
    assert check["uses"] == (["training"] if mode == "backward" else ["inference"])


def test_a_dense_bias_gets_its_gradient_checked(
    quick_run: tuple[dict[str, Any], Path, str],
) -> None:
    check = _checks(quick_run[0])["attention.sdpa.bias.fp32.backward"]
    assert "bias_grad" not in check["numbers"]  # SDPA computes it: nothing was left out
    assert check["numbers"]["worst"].split()[0] in {"out", "dq", "dk", "dv", "dbias"}


@pytest.mark.parametrize("name", ["attention.sdpa.dropout", "compile.sdpa.dropout"])
def test_dropout_is_checked_statistically_eager_and_compiled(
    quick_run: tuple[dict[str, Any], Path, str], name: str
) -> None:
    check = _checks(quick_run[0])[name]
    _measured_and_sensitive(check)
    assert check["numbers"]["p"] == 0.3
    assert check["numbers"]["same_seed_bitwise_equal"] is True


@pytest.mark.parametrize(
    "name",
    [
        "compile.sdpa.bias.dynamic.fullgraph.fp32.backward",
        "compile.sdpa.padding.dynamic.fullgraph.fp32.backward",
        "compile.sdpa.causal.dynamic.fullgraph.fp32.forward",
    ],
)
def test_quick_compiles_training_with_a_tensor_bias_on_cpu(
    quick_run: tuple[dict[str, Any], Path, str], name: str
) -> None:
    check = _checks(quick_run[0])[name]
    _measured_and_sensitive(check)
    assert check["numbers"]["graph_breaks"] == 0
    assert check["numbers"]["recompilations_on_seen_shapes"] == 0
    assert check["numbers"]["compilations"] <= check["numbers"]["compilations_allowed"]


def test_the_model_training_step_runs_on_cpu(
    quick_run: tuple[dict[str, Any], Path, str],
) -> None:
    check = _checks(quick_run[0])["model.diffusers.qwenimage.sdpa.training.eager"]
    if importlib.util.find_spec("diffusers") is None:
        assert check["status"] == "skip" and "diffusers" in check["reason"]
        pytest.skip("diffusers is not installed: the model check skipped (as it should)")
    _measured_and_sensitive(check)
    assert check["uses"] == ["training"]
    assert check["via"] == "diffusers"
    assert check["numbers"]["padded_text_tokens"] > 0
    assert isinstance(check["numbers"]["gradients_worst_parameter"], str)


@pytest.mark.parametrize("form", ["bool2d", "bool4d_b11n", "bool4d_b1mn", "additive"])
def test_quick_checks_every_mask_form_through_diffusers_dispatch(
    quick_run: tuple[dict[str, Any], Path, str], form: str
) -> None:
    checks = _checks(quick_run[0])
    native, xformers = checks[f"masks.native.{form}.fp32"], checks[f"masks.xformers.{form}.fp32"]
    assert xformers["status"] == "skip" and xformers["reason"]
    if importlib.util.find_spec("diffusers") is None:
        assert native["status"] == "skip" and "diffusers" in native["reason"]
        pytest.skip("diffusers is not installed: the mask checks skipped (as they should)")
    _measured_and_sensitive(native)
    assert native["uses"] == ["inference", "training"]
    assert native["numbers"]["form"] == form
    assert native["via"] == xformers["via"] == "diffusers"  # an advisory's, not the row's


@pytest.fixture(scope="module")
def compile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every mask kind compiled (dynamic shapes, fullgraph) through the backward pass."""
    out = tmp_path_factory.mktemp("compile") / "results.json"
    proc = _suite(
        "--out", str(out), "--checks", "compile.sdpa.*.dynamic.fullgraph.fp32.backward",
        timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.parametrize(
    "mask", ["none", "causal", "blockdiag", "bias", "padding", "bias_b1mn", "bias_expanded"]
)
def test_every_mask_kind_compiles_through_the_backward_pass_on_cpu(
    compile_run: dict[str, Any], mask: str
) -> None:
    check = _checks(compile_run)[f"compile.sdpa.{mask}.dynamic.fullgraph.fp32.backward"]
    _measured_and_sensitive(check)
    assert check["uses"] == ["training-compiled"]
    assert check["numbers"]["graph_breaks"] == 0
    assert check["numbers"]["recompilations_on_seen_shapes"] == 0
    assert check["numbers"]["step_ms"] > 0


def test_gpu_checks_skip_with_the_reason(quick_run: tuple[dict[str, Any], Path, str]) -> None:
    checks = {c["name"]: c for c in quick_run[0]["checks"]}
    for name in (
        "environment.cuda.device",
        "performance.sdpa.bf16.s8192.d128",
        "multigpu.ddp.xformers",
    ):
        assert checks[name]["status"] == "skip"
        assert checks[name]["reason"]
    assert "CUDA" in checks["performance.sdpa.bf16.s8192.d128"]["reason"]


def test_summary_is_printed(quick_run: tuple[dict[str, Any], Path, str]) -> None:
    assert "checks:" in quick_run[2] and "direct gates:" in quick_run[2]


#: seconds a check may run, counted from its start: the hung check is killed this long after
#: it began, whatever the imports before it took (each check here takes well under a second)
CHECK_LIMIT_S = 6


@pytest.mark.parametrize(
    ("fault", "status", "words"),
    [
        ("abort", "error", "SIGSEGV"),
        ("hang", "timeout", f"the check's time limit of {CHECK_LIMIT_S}s ran out"),
        ("raise", "error", "fault injected"),
    ],
)
@pytest.mark.parametrize(
    ("fork_server", "jobs"),
    [(True, 1), (True, 2), (False, 1)],
    ids=["forked", "forked-side-by-side", "fresh-interpreters"],
)
def test_a_crash_or_hang_loses_nothing_else(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    status: str,
    words: str,
    fork_server: bool,
    jobs: int,
) -> None:
    victim = "attention.sdpa.causal.fp16.forward"
    for key, value in _env(**{FAULT_VARIABLE: f"{victim}={fault}"}).items():
        monkeypatch.setenv(key, value)
    opts = RunOptions(
        out=tmp_path / "r.json",
        checks=(
            "attention.sdpa.none.*.forward",
            "attention.sdpa.causal.*.forward",
            "environment.versions",
        ),
        # the groups' own limits are far off: only the check's limit can end the hang in time
        timeouts={"attention": 120, "environment": 120},
        check_timeout=CHECK_LIMIT_S,
        fork_server=fork_server,
        jobs=jobs,
    )
    results = run_suite(opts, echo=lambda _line: None)
    assert results.runner["launch"]["fork_server"] is fork_server
    assert results.runner["launch"]["jobs"] == jobs
    checks = {c.name: c for c in results.checks}
    assert [c.group for c in results.checks] == sorted(
        (c.group for c in results.checks), key=["environment", "attention"].index
    )
    assert checks[victim].status == status
    assert words in checks[victim].reason
    assert checks["attention.sdpa.none.fp32.forward"].status == "pass"  # ran before the fault
    assert checks["environment.versions"].status == "pass"  # another group, unaffected
    # after a crash or a hang the worker is restarted for what was left
    assert checks["attention.sdpa.causal.fp32.forward"].status == "pass"


#: the xformers installed here (the tests session installs the suite's group): the CPU
#: combination is this environment only when it names that one too
XFORMERS = importlib.metadata.version("xformers") if importlib.util.find_spec("xformers") else None
CPU = "py3.11-cpu-torch2.13.0" + (f"-xformers{XFORMERS}" if XFORMERS else "")

MATRIX = f"""
[axes]
python = ["3.11"]

[[combinations]]
python = "3.11"
cuda = "cpu"
torch = "2.13.0"
{f'xformers = "{XFORMERS}"' if XFORMERS else ""}

[[combinations]]
python = "3.11"
cuda = "cu130"
torch = "2.11.0"
xformers = "0.0.35"
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "matrix.toml").write_text(MATRIX)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder",
            "conformance",
            "--matrix",
            str(tmp_path / "matrix.toml"),
            "--locks",
            str(tmp_path / "locks"),
            "--out-dir",
            str(tmp_path / "results"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        check=False,
        cwd=ROOT,
    )


def test_in_place_runs_for_the_matching_combination(tmp_path: Path) -> None:
    proc = _cli(
        tmp_path,
        CPU,
        "--in-place",
        "--allow-cpu",
        "--quick",
        "--checks",
        "attention.sdpa.none.*.forward",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results" / f"{CPU}.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(results)
    assert results["combination"] == CPU
    assert results["lock_sha256"] is None  # no locks/resolution.json here
    assert {c["status"] for c in results["checks"]} == {"pass"}


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (
            ("py3.11-cu130-torch2.11.0-xformers0.0.35", "--in-place", "--allow-cpu"),
            2,
            "torch is '2.13.0",
        ),
        ((CPU, "--in-place"), 3, "no CUDA GPU"),
        ((CPU,), 2, "resolution.json: not found"),
    ],
)
def test_refusals_say_what_is_wrong(
    tmp_path: Path, args: tuple[str, ...], status: int, words: str
) -> None:
    proc = _cli(tmp_path, *args)
    assert proc.returncode == status, proc.stderr
    assert words in proc.stderr
    assert not (tmp_path / "results").exists()  # nothing partially written


def _resolution(tmp_path: Path, sha: str) -> None:
    """A resolution.json that resolves both combinations of MATRIX to a lock with ``sha``."""
    combos = [
        {"id": cid, "status": "resolved", "reason": "", "python": "3.11", "cuda": cuda,
         "platform": "manylinux_2_28_x86_64", "lock": f"locks/{cid}.toml", "lock_sha256": sha}
        for cid, cuda in (
            (CPU, "cpu"),
            ("py3.11-cu130-torch2.11.0-xformers0.0.35", "cu130"),
        )
    ]  # fmt: skip
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "resolution.json").write_text(
        json.dumps(
            {
                "schema": "envbuilder.resolution/1",
                "matrix": str(tmp_path / "matrix.toml"),
                "matrix_sha256": "0" * 64,
                "combinations": combos,
            }
        )
    )


@pytest.mark.parametrize(
    ("combination", "extra", "bound"),
    [
        (CPU, (), True),  # this environment is the combination
        ("py3.11-cu130-torch2.11.0-xformers0.0.35", ("--force",), False),  # it is not
    ],
)
def test_a_run_names_the_lock_only_when_the_environment_is_the_combination(
    tmp_path: Path, combination: str, extra: tuple[str, ...], bound: bool
) -> None:
    sha = "ab" * 32
    _resolution(tmp_path, sha)
    proc = _cli(
        tmp_path, combination, "--in-place", "--allow-cpu", "--quick",
        "--checks", "attention.sdpa.none.fp32.forward", *extra,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results" / f"{combination}.json").read_text())
    assert results["lock_sha256"] == (sha if bound else None)


@pytest.mark.parametrize(
    ("patterns", "words"),
    [
        (("atention",), "no check group 'atention' (did you mean 'attention'?)"),
        (("attention.sdpz",), "no check matches --checks attention.sdpz; nothing was written"),
    ],
)
def test_checks_that_select_nothing_are_refused_and_keep_earlier_results(
    tmp_path: Path, patterns: tuple[str, ...], words: str
) -> None:
    out = tmp_path / "results.json"
    out.write_text('{"earlier": true}\n', encoding="utf-8")
    selection = [a for p in patterns for a in ("--checks", p)]
    proc = _suite("--quick", "--out", str(out), *selection, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert words in proc.stderr
    assert out.read_text(encoding="utf-8") == '{"earlier": true}\n'


@pytest.mark.parametrize(
    ("preload", "words"),
    [("dies_on_import,json", "did not start"), ("json,dies_on_import", "fork server")],
    ids=["before-ready", "after-ready"],
)
def test_a_fork_server_that_dies_leaves_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preload: str, words: str
) -> None:
    """The server dies while importing its preload modules, before or after it said it
    answers requests: every group still runs, each in a fresh interpreter, and the
    results say why."""
    dies = "import os\nos._exit(3)\n"
    _preloading(tmp_path, monkeypatch, {"dies_on_import": dies}, preload)
    lines: list[str] = []
    results = run_suite(
        RunOptions(out=tmp_path / "r.json", checks=("environment.versions",)),
        echo=lines.append,
    )
    assert [(c.name, c.status) for c in results.checks] == [("environment.versions", "pass")]
    launch = results.runner["launch"]
    assert launch["fork_server"] is False
    assert words in launch["fork_server_error"]
    assert any("fresh interpreter" in line for line in lines)


def _preloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: dict[str, str], preload: str
) -> None:
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    env = _env(ENVBUILDER_CONFORMANCE_PRELOAD=preload)
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _launch_after_loading(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    library: Path,
    preload: str = "json,loads_driver,email.message",
) -> dict[str, Any]:
    """Run one check with ``loads_driver`` (which loads ``library``) among the preload
    modules; the run must pass and its groups be forked. Returns ``runner.launch``."""
    loads = f"import ctypes\nctypes.CDLL({str(library)!r})\n"
    slow = "import time\ntime.sleep(2)\n"
    _preloading(tmp_path, monkeypatch, {"loads_driver": loads, "slow_import": slow}, preload)
    results = run_suite(
        RunOptions(out=tmp_path / "r.json", checks=("environment.versions",)),
        echo=lambda _line: None,
    )
    assert [(c.name, c.status) for c in results.checks] == [("environment.versions", "pass")]
    launch: dict[str, Any] = results.runner["launch"]
    assert launch["fork_server"] is True
    return launch


def test_a_preload_module_that_loads_the_cuda_driver_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module after whose import a libcuda is mapped that cannot say whether it was
    initialised makes the server start over without it; the modules after it are still
    preloaded and the groups are still forked."""
    library = next(p for p in LIBZ if p.is_file())
    fake = tmp_path / "libcuda.so.1"
    fake.write_bytes(library.read_bytes())
    launch = _launch_after_loading(tmp_path, monkeypatch, fake)
    assert launch["preloaded"] == ["json", "email.message"]
    assert "libcuda.so.1 is loaded and cannot say" in launch["preload_skipped"]["loads_driver"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a fake driver")
@pytest.mark.parametrize(
    ("answer", "kept"), [(3, True), (0, False)], ids=["not-initialised", "initialised"]
)
def test_the_driver_says_whether_it_was_initialised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: int, kept: bool
) -> None:
    """torch maps libcuda at import without initialising it: such a module stays preloaded.
    A module after which the driver reports a context state (cuInit ran) is dropped."""
    launch = _launch_after_loading(tmp_path, monkeypatch, _fake_driver(tmp_path, answer))
    assert ("loads_driver" in launch["preloaded"]) is kept
    assert "email.message" in launch["preloaded"]
    if not kept:
        assert "cuCtxGetCurrent returned 0" in launch["preload_skipped"]["loads_driver"]


def _fake_driver(tmp_path: Path, answer: int) -> Path:
    """A libcuda whose cuCtxGetCurrent returns ``answer`` (3: not initialised, 0: it is)."""
    source = tmp_path / "fake_driver.c"
    source.write_text(f"int cuCtxGetCurrent(void **c) {{ *c = 0; return {answer}; }}\n")
    fake = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(fake), str(source)], check=True)
    return fake


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a fake driver")
def test_the_probe_finds_the_module_that_initialises_the_driver_before_the_server_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the server spends 2 s on ``slow_import``, the probe imports the later modules
    from the last one back and finds that ``loads_driver`` initialises the driver: the
    server skips it without importing it (no start over), and keeps the module after it."""
    preload = "json,slow_import,loads_driver,email.message"
    launch = _launch_after_loading(tmp_path, monkeypatch, _fake_driver(tmp_path, 0), preload)
    assert launch["preloaded"] == ["json", "slow_import", "email.message"]
    why = launch["preload_skipped"]["loads_driver"]
    assert why.startswith("importing it in a probe process") and "returned 0" in why
    assert "loads_driver" not in launch["preload_module_s"]  # the server never imported it


@pytest.mark.parametrize(
    "preload", ["breaks_children,json", "json,breaks_children"], ids=["facts", "groups"]
)
def test_forked_children_that_cannot_work_leave_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preload: str
) -> None:
    """Forked children die at once, the runner facts or a group's: the runner stops
    forking, and the run is what fresh interpreters give."""
    breaks = "import os\nos.register_at_fork(after_in_child=lambda: os._exit(7))\n"
    _preloading(tmp_path, monkeypatch, {"breaks_children": breaks}, preload)
    results = run_suite(
        RunOptions(out=tmp_path / "r.json", checks=("environment.versions",)),
        echo=lambda _line: None,
    )
    assert [(c.name, c.status) for c in results.checks] == [("environment.versions", "pass")]
    assert results.runner["torch"] != "unknown"
    launch = results.runner["launch"]
    assert launch["fork_server"] is False
    assert "exit status 7" in launch["fork_server_error"]


def test_forked_groups_report_what_the_server_preloaded(tmp_path: Path) -> None:
    proc = _suite("--out", str(tmp_path / "r.json"), "--checks", "environment.versions")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    launch = json.loads((tmp_path / "r.json").read_text())["runner"]["launch"]
    assert launch["fork_server"] is True
    assert launch["preloaded"][0] == "torch"
    assert launch["jobs"] == 1  # the CPU: one group at a time
    assert "torch" not in launch["preload_skipped"]


def test_a_group_split_across_processes_gives_what_one_process_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attention group in three processes and the compile group in two (one of them
    with nothing to do): the same checks, statuses and order as one process each."""
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    checks = ("attention.*.none.*", "attention.*.causal.*", "compile.sdpa.none.static.fullgraph.*")
    whole = run_suite(RunOptions(out=tmp_path / "whole.json", checks=checks), echo=print)
    lines: list[str] = []
    split = run_suite(
        RunOptions(
            out=tmp_path / "split.json", checks=checks, jobs=3, parts={"attention": 3, "compile": 2}
        ),
        echo=lines.append,
    )
    assert [(c.name, c.status) for c in split.checks] == [(c.name, c.status) for c in whole.checks]
    assert len(whole.checks) > 8
    assert split.runner["launch"]["parts"] == {"attention": 3, "compile": 2}
    assert whole.runner["launch"]["parts"] == {}
    assert "▶ attention (3 processes)" in lines
