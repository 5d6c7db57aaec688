"""``envbuilder repro``: which check and results file it takes, the case it rebuilds (the
same as the suite's own definitions), and a script that compiles and imports nothing
from envbuilder, for every family of checks."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from envbuilder.cli import main
from envbuilder.conformance import _dropout, checks_attention, checks_compile, checks_model
from envbuilder.conformance import tolerance as suite_tolerance
from envbuilder.conformance._attn import MASKS
from envbuilder.conformance._context import Context
from envbuilder.errors import InputError
from envbuilder.repro import cases, choose, generate, load, results_in
from envbuilder.repro.cases import Profile, Shape, UnsupportedCheck, infer_profile, plan
from envbuilder.repro.results import ResultsFile
from envbuilder.repro.script import COMPILE_LIMITS, default_filename

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
CUDART = RESULTS / "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200.json"
PROFILES = [
    (Context(device="cpu", quick=False), Profile(cuda=False, quick=False)),
    (Context(device="cuda:0", quick=True), Profile(cuda=True, quick=True)),
    (Context(device="cuda:0", quick=False), Profile(cuda=True, quick=False)),
]


def _shape(case: Any) -> Shape:
    return Shape(
        B=case.B, M=case.M, N=case.N, H=case.H, K=case.K, mask=case.mask, seqlens=case.seqlens
    )


# --- the restated definitions are the suite's ------------------------------------------


@pytest.mark.parametrize(("ctx", "profile"), PROFILES)
def test_attention_cases_are_the_suites(ctx: Context, profile: Profile) -> None:
    for mask in checks_attention.MASKS:
        planned = plan(f"attention.sdpa.{mask}.fp16.backward", {}, profile)
        assert isinstance(planned, cases.AttentionCase)
        assert [(c.shape, c.seed, c.grad_seed) for c in planned.cases] == [
            (_shape(b.with_mask(mask)), 100 + i, 200 + i)
            for i, b in enumerate(checks_attention.base_cases(ctx))
        ]


@pytest.mark.parametrize(("ctx", "profile"), PROFILES)
def test_compile_shapes_dropout_and_model_config_are_the_suites(
    ctx: Context, profile: Profile
) -> None:
    for mask in MASKS:
        for dynamic in (False, True):
            kind = "dynamic" if dynamic else "static"
            planned = plan(f"compile.xformers.{mask}.{kind}.nobreaks.fp32.forward", {}, profile)
            assert isinstance(planned, cases.CompileCase)
            assert [(c.shape, c.seed, c.grad_seed) for c in planned.cases] == [
                (_shape(c), 300 + i, 400 + i)
                for i, c in enumerate(checks_compile.shapes(ctx, mask, dynamic))
            ]
    dropout = plan("compile.sdpa.dropout", {}, profile)
    suite_case, suite_dtype = _dropout._case(ctx)
    assert isinstance(dropout, cases.DropoutCase)
    assert (dropout.shape, dropout.dtype) == (_shape(suite_case), suite_dtype)
    model = plan("model.diffusers.qwenimage.xformers.training.compiled", {}, profile)
    assert isinstance(model, cases.ModelCase)
    assert dict(model.config) == checks_model._config(ctx)


def test_constants_are_the_suites() -> None:
    assert cases.MODEL_ALIGNED_TEXT == checks_model.ALIGNED_TEXT
    assert cases.MODEL_UNALIGNED_TEXT == checks_model.UNALIGNED_TEXT
    assert cases.MODEL_IMAGE_SIDE == checks_model.IMAGE_SIDE
    assert cases.MODEL_ATTENTION_GAIN == checks_model.ATTENTION_GAIN
    assert cases.MODEL_LEARNING_RATE == checks_model.LEARNING_RATE
    assert cases.DROPOUT_P == _dropout.P
    assert cases.DROPOUT_STD_DEVIATIONS == _dropout.STD_DEVIATIONS
    assert COMPILE_LIMITS == checks_compile._COMPILE_LIMITS
    script = generate(
        choose([load(CUDART)], "compile.xformers.bias.static.fullgraph.fp16.backward")
    )[1]
    assigned = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(script).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("FLOOR", "K", "SENSITIVITY_RATIO", "COMPILE_LIMITS")
    }
    assert assigned == {
        "FLOOR": suite_tolerance.FLOOR,
        "K": suite_tolerance.K,
        "SENSITIVITY_RATIO": suite_tolerance.SENSITIVITY_RATIO,
        "COMPILE_LIMITS": checks_compile._COMPILE_LIMITS,
    }


# --- choosing the check and the results file ------------------------------------------


def test_without_results_the_newest_file_where_the_check_failed_is_used() -> None:
    # the torch-alone files hold the name too, skipped (no xformers there)
    got = choose(results_in(RESULTS), "compile.xformers.causal.dynamic.fullgraph.bf16.forward")
    assert got.results.path == CUDART
    assert got.status == "fail"


def test_a_glob_matching_one_check_is_that_check() -> None:
    got = choose([load(CUDART)], "model.*.xformers.training.compiled")
    assert got.name == "model.diffusers.qwenimage.xformers.training.compiled"


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (
            "compile.xformers.bias.static.fulgraph.fp16.backward",
            "did you mean 'compile.xformers.bias.static.fullgraph.fp16.backward'",
        ),
        ("compile.xformers.bias.*.backward", "matches 8 checks in"),
        ("nothing.like.this", "no check 'nothing.like.this' in"),
    ],
)
def test_unknown_or_ambiguous_checks_are_input_errors(pattern: str, says: str) -> None:
    with pytest.raises(InputError, match="") as raised:
        choose([load(CUDART)], pattern)
    assert raised.value.return_code == 2
    assert says in str(raised.value)


def test_a_file_that_is_not_results_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "compat.lock.json"
    bad.write_text(json.dumps({"schema": "envbuilder.compat/2"}))
    with pytest.raises(InputError, match="not a conformance results file"):
        load(bad)


@pytest.mark.parametrize(
    ("numbers", "name", "file_quick", "quick"),
    [
        ({"cases": 2}, "attention.xformers.bias.bf16.forward", False, True),
        ({"cases": 4}, "attention.xformers.bias.bf16.forward", True, False),
        (
            {"cases": 1, "unsupported": "a || b || c"},
            "attention.sdpa.none.fp16.forward",
            False,
            False,
        ),
        ({}, "attention.sdpa.none.fp16.forward", True, True),
    ],
)
def test_a_quick_run_is_told_by_its_case_count_before_its_file_name(
    numbers: dict[str, object], name: str, file_quick: bool, quick: bool
) -> None:
    profile = infer_profile(name, numbers, cuda=True, file_says_quick=file_quick)
    assert profile == Profile(cuda=True, quick=quick)


# --- what is rebuilt ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("environment.xformers.import_no_cuda_init", "the 'environment' group"),
        ("performance.attention.xformers", "the 'performance' group"),
        (
            "compile.xformers.bias.static.nobreaks.fp16.backward.dynamo_disable",
            "envbuilder repro compile.xformers.bias.static.nobreaks.fp16.backward",
        ),
        ("attention.xformers.none.fp16", "not an attention correctness"),  # suite 1.x naming
        ("masks.flash.bool2d.fp16", "unknown attention backend 'flash'"),
    ],
)
def test_checks_without_a_case_are_refused_naming_what_is_supported(name: str, says: str) -> None:
    with pytest.raises(UnsupportedCheck) as raised:
        plan(name, {}, Profile(cuda=True, quick=False))
    assert says in str(raised.value)
    assert "compile.<impl>.<mask>" in str(raised.value)
    assert raised.value.return_code == 2


def test_a_workaround_check_rebuilds_its_direct_case_with_sdpa() -> None:
    profile = Profile(cuda=True, quick=False)
    direct = plan("compile.xformers.padding.dynamic.fullgraph.bf16.backward", {}, profile)
    instead = plan(
        "compile.xformers.padding.dynamic.fullgraph.bf16.backward.sdpa_under_compile", {}, profile
    )
    assert isinstance(direct, cases.CompileCase) and isinstance(instead, cases.CompileCase)
    assert (direct.impl, instead.impl) == ("xformers", "sdpa")
    assert direct.cases == instead.cases


def test_the_masks_group_takes_its_case_from_the_results() -> None:
    planned = plan(
        "masks.xformers.bool4d_b1mn.bf16",
        {"case": "B2 M77 N77 H4 K64", "seed": 9},
        Profile(cuda=True, quick=False),
    )
    assert isinstance(planned, cases.MaskFormCase)
    assert (planned.shape.label, planned.seed, planned.shape_recorded) == (
        "B2 M77 N77 H4 K64 none",
        9,
        True,
    )


# --- the script ----------------------------------------------------------------------

ALLOWED_IMPORTS = {
    "math",
    "re",
    "sys",
    "traceback",
    "copy",
    "collections",
    "torch",
    "xformers",
    "diffusers",
}


def _imports(text: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def _synthetic(name: str, **fields: object) -> ResultsFile:
    data = json.loads(CUDART.read_text())
    check = {"group": name.split(".")[0], "name": name, "status": "fail", "gate": True}
    check |= {"reason": "output error 0.46 > bound 0.0321 (math path 0.0107)", "numbers": {}}
    data["checks"] = [check | fields]
    return ResultsFile(path=Path("results/synthetic.json"), data=data)


FAMILIES = [
    "attention.xformers.bias.bf16.backward",
    "attention.sdpa.blockdiag.fp16.forward",
    "attention.xformers.bias_b1mn.safe",
    "attention.xformers.dropout",
    "compile.xformers.bias.static.fullgraph.fp16.backward",
    "compile.xformers.causal.dynamic.fullgraph.bf16.forward",
    "compile.sdpa.padding.dynamic.nobreaks.bf16.backward",
    "compile.xformers.dropout",
    "model.diffusers.qwenimage.xformers.training.compiled",
    "model.diffusers.qwenimage.xformers.unaligned_mask",
    "masks.xformers.bool4d_b11n.bf16",
    "masks.native.additive.fp16",
    "attention.xformers.padding.fp16.backward.sdpa_instead",
]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_gives_a_script_that_compiles_and_needs_no_envbuilder(name: str) -> None:
    _, text = generate(choose([_synthetic(name)], name))
    compile(text, default_filename(name), "exec")
    imported = _imports(text)
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS
    assert "envbuilder" not in imported
    needs_diffusers = name.startswith(("model.", "masks."))
    assert ("diffusers" in imported) == needs_diffusers
    assert f"# Check:     {name}" in text
    assert "DEVICE = 'cuda'" in text
    assert "REPRODUCED: " in text and "NOT REPRODUCED: " in text


def test_the_header_names_versions_recorded_failure_and_component_at_fault() -> None:
    name = "masks.xformers.bool4d_b1mn.bf16"
    results = _synthetic(
        name,
        numbers={
            "error": 0.46,
            "bound": 0.0321,
            "fault_component": "diffusers",
            "fault_op": "diffusers.models.attention_dispatch._xformers_attention",
        },
        cause="4-D boolean mask turned into a +1/0 bias",
    )
    _, text = generate(choose([results], name))
    # the header, its wrapped lines joined again
    header = " ".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    header = re.sub(r"\s+", " ", header)
    assert "torch 2.11.0+cu130 (CUDA 13.0), xformers 0.0.35, Python 3.12.3, NVIDIA H200" in header
    assert "combination py3.12-cu130-torch2.11.0-xformers0.0.35-cudart" in header
    assert (
        "Recorded: fail: output error 0.46 > bound 0.0321 (math path 0.0107) [worst error" in header
    )
    assert (
        "At fault: diffusers (diffusers.models.attention_dispatch._xformers_attention);" in header
    )
    assert "cause: 4-D boolean mask turned into a +1/0 bias" in header
    assert "Run it: python repro_masks_xformers_bool4d_b1mn_bf16.py" in header


def test_the_compile_script_builds_the_case_the_check_ran() -> None:
    name = "compile.xformers.bias.dynamic.nobreaks.bf16.backward"
    _, text = generate(choose([load(CUDART)], name))
    assert "DYNAMIC = True\nFULLGRAPH = False" in text
    assert "BACKWARD = True" in text
    assert "'B': 2, 'M': 77, 'N': 77, 'H': 4, 'K': 64, 'mask': 'bias'" in text
    assert "'B': 3, 'M': 141, 'N': 141, 'H': 4, 'K': 64" in text
    assert "bias = m  # [B,H,M,N]" in text
    assert "torch.compile(attention, backend=counting_backend, dynamic=DYNAMIC" in text


# --- the command ---------------------------------------------------------------------


def test_the_command_writes_the_script_or_refuses_a_passing_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "r.py"
    assert main(["repro", "attention.sdpa.bias.bf16.backward", "-o", str(out)]) == 1
    assert "did not fail in results/" in capsys.readouterr().err
    assert not out.exists()
    assert (
        main(
            [
                "repro",
                "compile.xformers.padding.static.fullgraph.bf16.backward",
                "-o",
                str(tmp_path),
            ]
        )
        == 0
    )
    written = tmp_path / "repro_compile_xformers_padding_static_fullgraph_bf16_backward.py"
    assert written.read_text().startswith("#!/usr/bin/env python3\n")
    err = capsys.readouterr().err
    assert f"fail in {CUDART.relative_to(ROOT)}" in err


def test_the_command_says_did_you_mean_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["repro", "model.diffusers.qwenimage.xformers.trainng.eager"]) == 2
    captured = capsys.readouterr()
    assert "did you mean 'model.diffusers.qwenimage.xformers.training.eager'" in captured.err
    assert captured.out == ""
