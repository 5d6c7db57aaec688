"""The committed H200 results (results/*.json) follow the published schema and say what happened."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "envbuilder" / "schemas" / "results.schema.json").read_text())
RESULTS = sorted((ROOT / "results").glob("*.json"))


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "results" / name).read_text())
    return data


def _checks(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["checks"]}


def test_there_are_example_results() -> None:
    assert RESULTS


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_results_follow_the_schema(path: Path) -> None:
    data = json.loads(path.read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    names = [c["name"] for c in data["checks"]]
    assert len(names) == len(set(names))
    assert all(c["name"].split(".", 1)[0] == c["group"] for c in data["checks"])


def test_schema_requires_uses_and_covers_from_results_2_on() -> None:
    data = _load("py3.12-cu130-torch2.11.0-xformers0.0.35.h200.quick.json")
    assert data["schema"] == "envbuilder.results/1"  # suite 1.x: no uses, no covers
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    with pytest.raises(jsonschema.ValidationError, match="'uses' is a required property"):
        jsonschema.Draft202012Validator(SCHEMA).validate({**data, "schema": "envbuilder.results/2"})
    check = {**data["checks"][0], "uses": [], "covers": None, "gate": True}
    with pytest.raises(jsonschema.ValidationError):  # a gate speaks for at least one use
        jsonschema.Draft202012Validator(SCHEMA).validate(
            {**data, "schema": "envbuilder.results/2", "checks": [check]}
        )
    workaround = {**check, "uses": ["training"], "workaround": "dynamo-disable"}
    with pytest.raises(jsonschema.ValidationError):  # a workaround check covers a check
        jsonschema.Draft202012Validator(SCHEMA).validate(
            {**data, "schema": "envbuilder.results/2", "checks": [workaround]}
        )


def test_schema_rejects_a_failure_without_reason() -> None:
    data = _load("py3.12-cu130-torch2.11.0-xformers0.0.35.h200.quick.json")
    data["checks"][0] = {**data["checks"][0], "status": "fail", "reason": ""}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(data)


def test_xformers_alone_reports_the_missing_cuda_12_runtime() -> None:
    checks = _checks(_load("py3.12-cu130-torch2.11.0-xformers0.0.35.h200.quick.json"))
    load = checks["environment.xformers.extension_loads"]
    assert load["status"] == "fail" and load["gate"] is True
    assert "libcudart.so.12" in load["reason"]


FULL = "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200.json"
QUICK = "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200.quick.json"
TORCH_ALONE_QUICK = "py3.12-cu130-torch2.11.0.h200.quick.json"
SUITE_2 = [p for p in RESULTS if json.loads(p.read_text())["schema"] == "envbuilder.results/2"]


def test_with_the_runtime_wheel_the_extension_loads_and_attention_is_correct() -> None:
    data = _load(FULL)
    checks = _checks(data)
    assert data["suite_version"] == "2.0.0" and data["lock_sha256"]
    assert checks["environment.xformers.extension_loads"]["status"] == "pass"
    for dtype in ("fp16", "bf16", "fp32"):
        for mask in ("none", "causal", "blockdiag", "bias", "padding", "bias_expanded"):
            for mode in ("forward", "backward"):
                check = checks[f"attention.xformers.{mask}.{dtype}.{mode}"]
                assert check["status"] == "pass", check["reason"]
    assert checks["attention.xformers.bias_b1mn.safe"]["numbers"]["outcome"] == "rejected"
    assert checks["attention.xformers.dropout"]["status"] == "pass"


@pytest.mark.parametrize("path", SUITE_2, ids=lambda p: p.name)
def test_every_numeric_check_that_passed_could_have_failed(path: Path) -> None:
    for check in json.loads(path.read_text())["checks"]:
        numbers = check["numbers"]
        if check["gate"] and check["status"] == "pass" and "sensitivity" in numbers:
            assert numbers["error"] <= numbers["bound"], check["name"]
            assert numbers["sensitivity_ratio"] >= 4, check["name"]


@pytest.mark.parametrize("path", SUITE_2, ids=lambda p: p.name)
def test_each_workaround_check_covers_a_failed_direct_check_of_its_file(path: Path) -> None:
    checks = _checks(json.loads(path.read_text()))
    for check in checks.values():
        if check["workaround"] is None:
            assert check["covers"] is None
            continue
        covered = checks[check["covers"]]
        assert covered["workaround"] is None and covered["gate"]
        assert covered["status"] in ("fail", "error", "timeout", "invalid")
        assert check["uses"] == covered["uses"]
        if check["status"] == "pass":
            assert isinstance(check["numbers"]["graph_breaks"], int)
            assert check["numbers"]["step_ms"] > 0


def test_compiled_xformers_with_a_causal_mask_breaks_the_graph_and_both_workarounds_pass() -> None:
    checks = _checks(_load(FULL))
    direct = "compile.xformers.causal.dynamic.fullgraph.bf16.forward"
    assert checks[direct]["status"] == "fail"
    assert "torch.* op returned non-Tensor" in checks[direct]["reason"]
    disabled = checks[f"{direct}.dynamo_disable"]
    sdpa = checks[f"{direct}.sdpa_under_compile"]
    assert disabled["status"] == sdpa["status"] == "pass"
    assert disabled["numbers"]["graph_breaks"] == 1 and sdpa["numbers"]["graph_breaks"] == 0


def test_compiled_training_with_an_xformers_tensor_bias_fails_and_sdpa_passes() -> None:
    checks = _checks(_load(FULL))
    for mask in ("bias", "padding", "bias_expanded"):
        direct = f"compile.xformers.{mask}.dynamic.fullgraph.bf16.backward"
        assert checks[direct]["status"] == "fail"
        assert "aten._efficient_attention_backward" in checks[direct]["reason"]
        assert checks[f"{direct}.sdpa_under_compile"]["status"] == "pass"
        forward = checks[f"compile.xformers.{mask}.dynamic.fullgraph.bf16.forward"]
        assert forward["status"] == "pass", forward["reason"]


def test_quick_keeps_compiled_training_with_a_bias_and_the_model_training_step() -> None:
    checks = _checks(_load(QUICK))
    for impl in ("xformers", "sdpa"):
        assert f"compile.{impl}.bias.dynamic.fullgraph.bf16.backward" in checks
        assert f"model.diffusers.qwenimage.{impl}.training.eager" in checks
    assert checks["model.diffusers.qwenimage.sdpa.training.eager"]["status"] == "pass"


def test_torch_alone_passes_every_sdpa_gate_and_skips_xformers() -> None:
    data = _load(TORCH_ALONE_QUICK)
    assert data["runner"]["xformers"] is None and data["lock_sha256"]
    load = _checks(data)["environment.xformers.extension_loads"]
    assert "xformers is not installed" in load["reason"]
    for check in data["checks"]:
        if check["impl"] == "xformers":
            assert check["status"] == "skip", check["name"]
        elif check["gate"]:
            assert check["status"] in ("pass", "skip"), check["name"]


def test_results_name_the_suite_s_files_relative_to_its_checkout() -> None:
    from envbuilder.conformance._record import relative_paths

    root = str(ROOT.resolve())
    assert relative_paths(f'File "{root}/envbuilder/conformance/checks_compile.py", line 1') == (
        'File "envbuilder/conformance/checks_compile.py", line 1'
    )
    absolute = re.compile(r'/[^ "|]+/envbuilder/conformance/')
    assert [p.name for p in RESULTS if absolute.search(p.read_text())] == []


def test_results_carry_no_runner_directories() -> None:
    runner_path = re.compile(r"(?<![\w.])/(?:tmp|opt|root|home|usr/local|usr/lib)/[^ \"|]+")
    found = {p.name: runner_path.findall(p.read_text()) for p in RESULTS}
    assert {name: paths for name, paths in found.items() if paths} == {}


def test_the_diffusers_model_s_xformers_backend_ignores_much_of_its_padding_mask() -> None:
    data = _load(FULL)
    checks = _checks(data)
    for name in ("inference.eager", "inference.compiled", "training.eager", "training.compiled"):
        sdpa = checks[f"model.diffusers.qwenimage.sdpa.{name}"]
        assert sdpa["status"] == "pass" and sdpa["numbers"]["sensitivity_ratio"] >= 4
    wrong = checks["model.diffusers.qwenimage.xformers.inference.eager"]
    assert wrong["status"] == "fail"
    # wrong by more than half the distance to the model run without its mask
    assert wrong["numbers"]["error"] > 0.5 * wrong["numbers"]["sensitivity"]
    assert checks["model.diffusers.qwenimage.xformers.inference.eager.sdpa_instead"]["status"] == (
        "pass"
    )
    unaligned = checks["model.diffusers.qwenimage.xformers.unaligned_mask"]
    assert unaligned["gate"] is False and unaligned["numbers"]["outcome"] == "rejected"
