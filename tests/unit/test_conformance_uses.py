"""Every check says which uses it speaks for; workaround checks cover one direct check;
--quick keeps what the budget promises (specs on a GPU context; nothing runs)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from envbuilder.conformance import GROUPS
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import USES, CheckSpec
from envbuilder.conformance.groups import group

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "envbuilder" / "schemas" / "results.schema.json").read_text())
NAME = re.compile(SCHEMA["properties"]["checks"]["items"]["properties"]["name"]["pattern"])


def _specs(quick: bool) -> list[CheckSpec]:
    ctx = Context(device="cuda:0", quick=quick)
    direct = [s for g in GROUPS for s in importlib.import_module(group(g).module).specs(ctx)]
    return direct + [w for s in direct for w in s.workarounds]


ALL = {s.name: s for s in _specs(quick=False)}


@pytest.mark.parametrize(
    ("pattern", "uses"),
    [
        (r"attention\.(xformers|sdpa)\.\w+\.(fp16|bf16|fp32)\.forward", ("inference",)),
        (r"attention\.(xformers|sdpa)\.\w+\.(fp16|bf16|fp32)\.backward", ("training",)),
        (r"attention\.(xformers|sdpa)\.dropout", ("training",)),
        (
            r"compile\.(xformers|sdpa)\.\w+\.(static|dynamic)\.\w+\.\w+\.forward",
            ("inference-compiled",),
        ),
        (
            r"compile\.(xformers|sdpa)\.\w+\.(static|dynamic)\.\w+\.\w+\.backward",
            ("training-compiled",),
        ),
        (r"compile\.(xformers|sdpa)\.dropout", ("training-compiled",)),
        (r"model\.diffusers\.qwenimage\.\w+\.inference\.eager", ("inference",)),
        (r"model\.diffusers\.qwenimage\.\w+\.inference\.compiled", ("inference-compiled",)),
        (r"model\.diffusers\.qwenimage\.\w+\.training\.eager", ("training",)),
        (r"model\.diffusers\.qwenimage\.\w+\.training\.compiled", ("training-compiled",)),
        (r"environment\.(torch|xformers)\.arch_covered", USES),
        (r"environment\.xformers\.extension_loads", USES),
        (r"multigpu\.ddp\.xformers", ("training",)),
        (r"masks\.\w+\.\w+\.(fp16|bf16)", ("inference", "training")),
    ],
)
def test_direct_checks_speak_for_their_uses(pattern: str, uses: tuple[str, ...]) -> None:
    chosen = [s for n, s in ALL.items() if re.fullmatch(pattern, n) and s.workaround is None]
    assert chosen, pattern
    assert {s.uses for s in chosen} == {uses}


def test_every_gate_names_a_use_and_every_name_fits_the_schema() -> None:
    assert all(s.uses for s in ALL.values() if s.gate)
    assert [n for n in ALL if not NAME.fullmatch(n)] == []
    assert [n for n in ALL if "breaks_allowed" in n] == []


def test_each_workaround_check_covers_its_direct_check_and_shares_its_uses() -> None:
    for spec in ALL.values():
        for workaround in spec.workarounds:
            assert workaround.covers == spec.name and workaround.uses == spec.uses
            assert workaround.gate and workaround.workarounds == ()


@pytest.mark.parametrize(
    ("pattern", "workarounds"),
    [
        (
            r"compile\.xformers\.(?!causal\.|blockdiag\.).*",
            {"dynamo-disable", "sdpa-under-compile"},
        ),
        (
            r"compile\.xformers\.(causal|blockdiag)\..*",
            {"mask-outside-compile", "dynamo-disable", "sdpa-under-compile"},
        ),
        (r"attention\.xformers\.\w+\.\w+\.(forward|backward)", {"sdpa-instead"}),
        (r"attention\.xformers\.dropout", {"sdpa-instead"}),
        (r"model\.diffusers\.qwenimage\.xformers\.\w+\.eager", {"sdpa-instead"}),
        (
            r"model\.diffusers\.qwenimage\.xformers\.\w+\.compiled",
            {"dynamo-disable", "sdpa-under-compile"},
        ),
        (r"masks\.xformers\.(bool2d|additive)\..*", {"sdpa-instead"}),
        (r"masks\.xformers\.bool4d_\w+\..*", {"mask-form", "sdpa-instead"}),
        (r"(attention|compile|model)\..*sdpa\..*", set()),
        (r"masks\.native\..*", set()),
    ],
)
def test_which_direct_checks_have_which_workarounds(pattern: str, workarounds: set[str]) -> None:
    chosen = [
        s
        for n, s in ALL.items()
        if re.fullmatch(pattern, n) and s.workaround is None and s.gate and s.impl is not None
    ]
    assert chosen, pattern
    for spec in chosen:
        assert {w.workaround for w in spec.workarounds} == workarounds, spec.name


def test_compile_covers_every_mask_kind_dtype_and_mode_for_both_implementations() -> None:
    from envbuilder.conformance._attn import MASKS

    for impl in ("xformers", "sdpa"):
        for mask in MASKS:
            cases = [n for n in ALL if n.startswith(f"compile.{impl}.{mask}.")]
            cases = [n for n in cases if ALL[n].workaround is None]
            assert len(cases) == 2 * 2 * 2 * 2, (impl, mask)  # dynamic, fullgraph, dtype, mode


def test_quick_keeps_compiled_training_with_a_tensor_bias_and_the_model_training_step() -> None:
    quick = {s.name for s in _specs(quick=True) if s.quick}
    for impl in ("xformers", "sdpa"):
        assert f"compile.{impl}.bias.dynamic.fullgraph.bf16.backward" in quick
        assert f"model.diffusers.qwenimage.{impl}.training.eager" in quick
        assert f"attention.{impl}.dropout" in quick


def test_quick_keeps_every_mask_form_of_both_backends_in_bf16() -> None:
    quick = {s.name for s in _specs(quick=True) if s.quick and s.group == "masks" and not s.covers}
    assert quick == {
        f"masks.{backend}.{form}.bf16"
        for backend in ("native", "xformers")
        for form in ("bool2d", "bool4d_b11n", "bool4d_b1mn", "additive")
    }
