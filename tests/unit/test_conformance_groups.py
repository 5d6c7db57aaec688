"""The group registry and the schedule read from it: which modules the fork server
preloads, how many processes a group gets from its measured costs, and in what order."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.conformance import GROUPS, costs, forkserver
from envbuilder.conformance.groups import (
    GroupSpec,
    builtin_groups,
    group,
    group_names,
    preload_order,
    register,
    registered,
    unregister,
)
from envbuilder.conformance.runner import RunOptions
from envbuilder.conformance.schedule import parts, plan_parts


def _spec(name: str, **extra: object) -> GroupSpec:
    fields: dict[str, object] = {
        "module": f"mod_{name}",
        "timeout_s": 60.0,
        "quick_timeout_s": 30.0,
    }
    return GroupSpec(name=name, **(fields | extra))  # type: ignore[arg-type]


def test_the_suites_groups_in_order() -> None:
    assert GROUPS == group_names() == tuple(g.name for g in builtin_groups())
    assert GROUPS == (
        "environment",
        "attention",
        "compile",
        "performance",
        "model",
        "masks",
        "multigpu",
    )


def test_the_fork_server_preloads_what_the_registry_says() -> None:
    assert (
        forkserver.DEFAULT_PRELOAD
        == preload_order()
        == (
            "torch",
            "envbuilder.conformance.checks_environment",
            "envbuilder.conformance.checks_attention",
            "envbuilder.conformance.checks_performance",
            "envbuilder.conformance.checks_multigpu",
            "torch._dynamo",
            "torch._inductor.compile_fx",
            "envbuilder.conformance.checks_compile",
            "diffusers.models.transformers.transformer_qwenimage",
            "envbuilder.conformance.checks_model",
            "envbuilder.conformance.checks_masks",
        )
    )


def test_a_group_waits_for_its_imports_before_its_module() -> None:
    specs = (_spec("light"), _spec("heavy", imports=("slow",)), _spec("later", imports=("slow",)))
    assert preload_order(specs) == ("torch", "mod_light", "slow", "mod_heavy", "mod_later")


def test_time_limits_come_from_the_registry_unless_given() -> None:
    opts = RunOptions(out=Path("r.json"))
    assert opts.timeout_for("compile") == group("compile").timeout_s == 600
    quick = RunOptions(out=opts.out, quick=True, timeouts={"masks": 5})
    assert quick.timeout_for("compile") == group("compile").quick_timeout_s == 300
    assert quick.timeout_for("masks") == 5


def test_registering_and_unregistering() -> None:
    with registered(_spec("toy")) as spec:
        assert group("toy") is spec
        assert group_names()[-1] == "toy"
        with pytest.raises(ValueError, match="already registered"):
            register(_spec("toy"))
    assert "toy" not in group_names()
    with pytest.raises(KeyError, match="no check group 'toy'; the groups are environment"):
        group("toy")
    with pytest.raises(ValueError, match="one of the suite's own groups"):
        unregister("compile")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"name": "a.b"}, "one identifier"),
        ({"name": ""}, "one identifier"),
        ({"shard_unit_parts": 0}, "shard_unit_parts"),
        ({"timeout_s": 0}, "positive"),
    ],
)
def test_bad_group_specs_are_refused(fields: dict[str, object], problem: str) -> None:
    name = str(fields.pop("name", "toy"))
    with pytest.raises(ValueError, match=problem):
        _spec(name, **fields)


#: a table like the H200's: one group with one long unit among many, a small unsplit group
TABLE = {
    "compile.a": 40.0,
    "compile.b": 20.0,
    "compile.c": 20.0,
    "compile.d": 10.0,
    "compile.e": 10.0,
    "attention.x": 6.0,
    "attention.y": 6.0,
    "environment": 5.0,
    "performance": 30.0,
}


def test_a_group_gets_the_processes_its_measured_work_needs() -> None:
    names = ["environment", "attention", "compile", "performance"]
    counts = parts(names, jobs=4, table=TABLE)
    # compile in 3 (40 | 20+10 | 20+10) ends at 40 s, the longest unit; more would not help
    assert counts == {"environment": 1, "attention": 1, "compile": 3, "performance": 1}
    assert costs.makespan([40, 30, 30, 12, 5], 4) == 40
    # one process at a time: nothing is split
    assert parts(names, jobs=1, table=TABLE) == dict.fromkeys(names, 1)
    # given counts win, within what can run at once and what can be split
    fixed = parts(names, jobs=2, table=TABLE, fixed={"compile": 5, "environment": 3})
    assert fixed == {"environment": 1, "attention": 1, "compile": 2, "performance": 1}


def test_checks_patterns_narrow_the_units_counted() -> None:
    counts = parts(["compile"], jobs=4, table=TABLE, patterns=["compile.d", "compile.e.x.y"])
    assert counts == {"compile": 2}


def test_processes_start_longest_first() -> None:
    batch = ["environment", "attention", "compile"]
    counts = {"environment": 1, "attention": 1, "compile": 3}
    planned = plan_parts(batch, counts, table=TABLE)
    assert [(p.group, p.index, p.estimate_s) for p in planned] == [
        ("compile", 0, 40.0),
        ("compile", 1, 30.0),
        ("compile", 2, 30.0),
        ("attention", 0, 12.0),
        ("environment", 0, 5.0),
    ]
