"""``envbuilder repro``: which check and results file it takes, the case it rebuilds (the
same as the suite's own definitions), and a script that compiles and imports nothing
from envbuilder, for every family of checks."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from envbuilder.cli import main
from envbuilder.conformance import (
    _dropout,
    _workaround,
    checks_attention,
    checks_compile,
    checks_masks,
    checks_model,
)
from envbuilder.conformance import tolerance as suite_tolerance
from envbuilder.conformance._attn import DTYPES, MASKS
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


def _cpu_results(name: str, **numbers: object) -> ResultsFile:
    """A results file of a CPU run holding ``name`` as a failure with ``numbers``."""
    data = json.loads(CUDART.read_text())
    data["runner"] = dict(data["runner"], gpus=[])
    data["checks"] = [
        {"group": name.split(".")[0], "name": name, "status": "fail", "numbers": numbers}
    ]
    return ResultsFile(path=Path("results/cpu.json"), data=data)


def _script_namespace(text: str) -> dict[str, Any]:
    """The generated script's definitions, run as a module (its ``main`` is not called)."""
    namespace: dict[str, Any] = {"__name__": "repro_script"}
    exec(compile(text, "repro_script.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize(("ctx", "profile"), PROFILES)
def test_masks_cases_are_the_suites(ctx: Context, profile: Profile) -> None:
    for form in checks_masks.FORMS:
        for backend in checks_masks.BACKENDS:
            planned = plan(f"masks.{backend}.{form}.fp16", {}, profile)
            assert isinstance(planned, cases.MaskFormCase)
            assert planned.shape == _shape(checks_masks._case(ctx))
            assert (planned.seed, planned.mask_seed) == (checks_masks.SEED, checks_masks.MASK_SEED)
    assert cases.MASK_FORMS == checks_masks.FORMS
    assert cases.MASKS_PATTERN_KEEP == checks_masks.PATTERN_KEEP


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("form", checks_masks.FORMS)
def test_the_masks_script_builds_the_suites_tensors(
    form: checks_masks.Form, dtype_name: str
) -> None:
    """The script's inputs, mask, its meaning and the output gradient are the suite's, value
    for value (what the suite hands diffusers is what the script hands it)."""
    name = f"masks.native.{form}.{dtype_name}"
    text = generate(choose([_cpu_results(name)], name))[1]
    script = _script_namespace(text)
    got = script["masked_inputs"](script["DTYPE"])
    ctx = Context(device="cpu", quick=False)
    want = checks_masks.masked_inputs(ctx, form, DTYPES[dtype_name])
    for key in ("q", "k", "v", "grad", "attn_mask", "allowed", "bias"):
        assert got[key].dtype == getattr(want, key).dtype, key
        assert got[key].shape == getattr(want, key).shape, key
        assert bool((got[key] == getattr(want, key)).all()), key
    # the reference and the math path: the suite's _textbook on the same inputs
    args = (want.q.double(), want.k.double(), want.v.double(), want.allowed, want.bias)
    assert bool((script["textbook"](*args) == checks_masks._textbook(*args)).all())


def test_the_disable_machinery_counts_the_suites_operators() -> None:
    name = "compile.xformers.bias.static.fullgraph.fp32.backward.dynamo_disable"
    script = _script_namespace(generate(choose([_cpu_results(name)], name))[1])
    ops = [
        "xformers::efficient_attention_forward_cutlass",
        "xformers_flash::flash_fwd",
        "flash_attn_3::fwd",
        "aten::_efficient_attention_forward",
        "aten._efficient_attention_backward.default",
        "aten::_scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_flash_attention.default",
        "aten::_safe_softmax",
        "aten._softmax.default",
        "aten::mm",
        "aten::softmax",
    ]
    for op in ops:
        assert script["is_kernel_op"]("xformers", op) == _workaround.is_xformers_op(op), op
        assert script["is_kernel_op"]("sdpa", op) == _workaround._is_sdpa_dispatched(op), op


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
            "attention.xformers.bias.fp16.backward.dynamo_disable",
            "the suite has no dynamo-disable workaround for this check",
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


def test_the_masks_group_takes_its_case_and_seeds_from_the_results() -> None:
    planned = plan(
        "masks.xformers.bool4d_b1mn.bf16",
        {"case": "B2 M77 N77 H4 K64 none", "seed": 9, "mask_seed": 10},
        Profile(cuda=True, quick=False),
    )
    assert isinstance(planned, cases.MaskFormCase)
    assert (planned.shape.label, planned.seed, planned.mask_seed, planned.shape_recorded) == (
        "B2 M77 N77 H4 K64 none",
        9,
        10,
        True,
    )
    # results of suite 2.1.0 recorded no seeds: the suite's constants are what it used
    older = plan("masks.xformers.bool4d_b1mn.bf16", {}, Profile(cuda=True, quick=False))
    assert isinstance(older, cases.MaskFormCase)
    assert (older.seed, older.mask_seed, older.shape_recorded) == (61, 62, False)
    instead = plan(
        "masks.xformers.bool4d_b1mn.bf16.sdpa_instead", {}, Profile(cuda=True, quick=False)
    )
    assert isinstance(instead, cases.MaskFormCase)
    assert instead.backend == "native"


@pytest.mark.parametrize(
    ("name", "kind", "impl"),
    [
        (
            "compile.xformers.causal.dynamic.fullgraph.bf16.forward.dynamo_disable",
            cases.CompileCase,
            "xformers",
        ),
        ("compile.xformers.dropout.dynamo_disable", cases.DropoutCase, "xformers"),
        (
            "model.diffusers.qwenimage.xformers.training.compiled.dynamo_disable",
            cases.ModelCase,
            "xformers",
        ),
    ],
)
def test_a_dynamo_disable_check_rebuilds_its_case_behind_the_disable(
    name: str, kind: type, impl: str
) -> None:
    profile = Profile(cuda=True, quick=False)
    direct = plan(name.removesuffix(".dynamo_disable"), {}, profile)
    planned = plan(name, {}, profile)
    assert isinstance(planned, kind)
    assert isinstance(planned, cases.CompileCase | cases.DropoutCase | cases.ModelCase)
    assert planned.workaround == "dynamo-disable"
    assert planned.impl == impl
    if isinstance(planned, cases.CompileCase):
        assert isinstance(direct, cases.CompileCase)
        # a disabled call is a graph break by design: the suite compiles without fullgraph
        assert (planned.fullgraph, planned.cases) == (False, direct.cases)
    # the kernel the check recorded running behind the disable
    recorded = plan(name, {"disabled_kernel": "sdpa"}, profile)
    assert isinstance(recorded, kind)
    assert isinstance(recorded, cases.CompileCase | cases.DropoutCase | cases.ModelCase)
    assert recorded.impl == "sdpa"


# --- the script ----------------------------------------------------------------------

#: what a script may import: the standard library and the three packages of the stack
ALLOWED_IMPORTS = set(sys.stdlib_module_names) | {"torch", "xformers", "diffusers"}


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
    "masks.xformers.bool4d_b11n.fp16.sdpa_instead",
    "compile.xformers.bias.static.fullgraph.fp16.backward.dynamo_disable",
    "compile.xformers.dropout.dynamo_disable",
    "model.diffusers.qwenimage.xformers.inference.compiled.dynamo_disable",
]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_gives_a_script_that_compiles_and_needs_no_envbuilder(name: str) -> None:
    _, text = generate(choose([_synthetic(name)], name))
    compile(text, default_filename(name), "exec")
    imported = _imports(text)
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS
    assert {"torch"} <= imported
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
    assert "torch.compile(target, backend=counting_backend, dynamic=DYNAMIC" in text
    assert "WORKAROUND = None" in text


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
