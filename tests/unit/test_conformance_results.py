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


def test_with_the_runtime_wheel_the_extension_loads_and_attention_is_correct() -> None:
    data = _load("py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200x2.json")
    checks = _checks(data)
    assert checks["environment.xformers.extension_loads"]["status"] == "pass"
    for dtype in ("fp16", "bf16", "fp32"):
        for mask in ("none", "causal", "blockdiag", "bias", "bias_expanded"):
            assert checks[f"attention.xformers.{mask}.{dtype}"]["status"] == "pass"
    assert checks["attention.xformers.bias_b1mn.safe"]["numbers"]["outcome"] == "rejected"
    assert checks["multigpu.ddp.xformers"]["status"] == "pass"
    assert len(data["runner"]["gpus"]) == 2


def test_the_workarounds_are_recorded_where_the_direct_path_fails() -> None:
    checks = _checks(_load("py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200x2.json"))
    assert checks["compile.xformers.block.dynamic.fullgraph"]["status"] == "fail"
    for name, workaround in (
        ("compile.workaround.dynamo_disable.block.dynamic", "dynamo-disable"),
        ("compile.workaround.sdpa.block.dynamic", "sdpa-under-compile"),
    ):
        assert checks[name]["workaround"] == workaround
        assert checks[name]["status"] == "pass"


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


def test_the_full_h200_run_checks_the_diffusers_model_through_xformers() -> None:
    data = _load("py3.12-cu130-torch2.11.0-xformers0.0.35-cudart.h200.json")
    checks = _checks(data)
    assert data["lock_sha256"] and data["suite_version"] == "1.1.0"
    for name in ("xformers.eager", "xformers.compiled", "sdpa.compiled"):
        check = checks[f"model.diffusers.qwenimage.{name}"]
        assert check["status"] == "pass" and check["gate"] is True
        assert check["numbers"]["joint_tokens"] % 8 == 0
        assert check["numbers"]["error"] <= check["numbers"]["bound"]
    unaligned = checks["model.diffusers.qwenimage.xformers.unaligned_mask"]
    assert unaligned["gate"] is False and unaligned["numbers"]["outcome"] == "rejected"
    assert "attn_bias.stride(-2) % 8 != 0" in unaligned["reason"]
