"""The suite's plan is one torch-free source: the checks and ``envbuilder repro`` read the
same cases from it, and the results schema names the groups the registry has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from envbuilder.conformance import plan
from envbuilder.conformance.groups import builtin_groups
from envbuilder.repro import KNOWN, Recorded
from envbuilder.repro.records import RunFacts
from envbuilder.repro.scripts import render
from tests.unit.test_layers import _loaded_by

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "envbuilder" / "schemas" / "results.schema.json").read_text())


@pytest.mark.parametrize("module", ["envbuilder.conformance.plan", "envbuilder.repro"])
def test_the_plan_and_repro_load_no_torch(module: str) -> None:
    loaded = _loaded_by(module)
    assert "envbuilder.conformance.plan" in loaded
    assert {m for m in loaded if m.split(".")[0] in {"torch", "xformers", "diffusers"}} == set()


def _unrecorded(cause_key: str) -> Recorded:
    cause = next(c for c in KNOWN if c.key == cause_key)
    facts = RunFacts(
        source="r.json", combination=None, suite_version=None, finished=None, runner={}
    )
    name = cause.names[0].replace("*", "x")
    return Recorded(run=facts, name=name, status="fail", reason="", numbers={})


MASKS_CASE = plan.masks_case(cuda=True)
COMPILED = plan.compile_cases(cuda=True)[0]


def _sizes(case: plan.Case, *names: str) -> str:
    return ", ".join(str(getattr(case, n)) for n in names)


@pytest.mark.parametrize(
    ("cause", "line"),
    [
        (
            "diffusers-xformers-bool-mask",
            f"B, M, N, H, K, DTYPE = {_sizes(MASKS_CASE, *'BMNHK')}, torch.float16",
        ),
        (
            "xformers-compiled-bias-backward",
            f"B, M, N, H, K, DTYPE = {_sizes(COMPILED, *'BMNHK')}, torch.float16",
        ),
        (
            "xformers-causal-fullgraph",
            f"B, M, H, K, DTYPE = {_sizes(COMPILED, *'BMHK')}, torch.float16",
        ),
    ],
)
def test_a_script_without_a_recorded_case_takes_the_suites(cause: str, line: str) -> None:
    known = next(c for c in KNOWN if c.key == cause)
    assert line in render(known, [_unrecorded(cause)]).splitlines()


def test_the_results_schema_names_the_registrys_groups() -> None:
    found = _find(SCHEMA, "group")
    names = tuple(g.name for g in builtin_groups())
    assert tuple(found["group"]["enum"]) == names
    pattern = found["name"]["pattern"]
    alternation = re.fullmatch(r"\^\(([^)]*)\)\(.*", pattern)
    assert alternation is not None, pattern
    assert tuple(alternation[1].split("|")) == names


def _find(node: object, key: str) -> Any:
    """The first ``properties`` object in the schema with *key* and ``name``: a check's."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict) and key in props and "name" in props:
            return props
        for value in node.values():
            try:
                return _find(value, key)
            except LookupError:
                continue
    elif isinstance(node, list):
        for value in node:
            try:
                return _find(value, key)
            except LookupError:
                continue
    raise LookupError(key)
