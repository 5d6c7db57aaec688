"""Splitting a check group across processes: which checks go together, and where."""

from __future__ import annotations

import pytest

from envbuilder.conformance._record import CheckSpec, Outcome
from envbuilder.conformance.costs import deal
from envbuilder.conformance.worker import parse_shard, shard


def _spec(name: str) -> CheckSpec:
    return CheckSpec(name=name, gate=False, run=lambda: Outcome.passed())


NAMES = [
    "attention.xformers.none.fp16.forward",
    "attention.xformers.none.fp16.backward",
    "attention.xformers.causal.fp16.forward",
    "attention.xformers.dropout",
    "attention.sdpa.none.fp16.forward",
    "attention.sdpa.none.bf16.backward",
    "attention.sdpa.causal.fp16.forward",
]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 9])
def test_parts_cover_the_plan_once_and_keep_units_together(count: int) -> None:
    planned = [_spec(n) for n in NAMES]
    parts = [shard(planned, 3, i, count) for i in range(count)]
    positions = sorted(p for part in parts for p, _ in part)
    assert positions == list(range(len(NAMES)))  # every check once
    for part in parts:
        assert [p for p, _ in part] == sorted(p for p, _ in part)  # plan order within a part
        for position, spec in part:
            assert spec is planned[position]
    owner = {".".join(s.name.split(".")[:3]): i for i, part in enumerate(parts) for _, s in part}
    for i, part in enumerate(parts):
        for _, spec in part:
            assert owner[".".join(spec.name.split(".")[:3])] == i


def test_without_costs_units_are_dealt_out_in_plan_order() -> None:
    planned = [_spec(n) for n in NAMES]
    names = [[s.name for _, s in shard(planned, 3, i, 2)] for i in range(2)]
    # units: xformers.none, xformers.causal, xformers.dropout, sdpa.none, sdpa.causal
    assert names == [
        [NAMES[0], NAMES[1], NAMES[3], NAMES[6]],
        [NAMES[2], NAMES[4], NAMES[5]],
    ]


def test_with_costs_the_longest_unit_goes_first_to_the_least_loaded_part() -> None:
    planned = [_spec(n) for n in NAMES]
    costs = {
        "attention.xformers.none": 10.0,
        "attention.xformers.causal": 2.0,
        "attention.xformers.dropout": 1.0,
        "attention.sdpa.none": 6.0,
        "attention.sdpa.causal": 5.0,
    }
    names = [[s.name for _, s in shard(planned, 3, i, 2, costs)] for i in range(2)]
    # 10 -> part 0; 6 -> 1; 5 -> 1 (11); 2 -> 0 (12); 1 -> 1 (12); plan order within a part
    assert names == [
        [NAMES[0], NAMES[1], NAMES[2]],
        [NAMES[3], NAMES[4], NAMES[5], NAMES[6]],
    ]


def test_a_unit_of_unknown_cost_counts_as_the_mean_of_the_known() -> None:
    units = ["a", "b", "c", "new"]
    known = {"a": 9.0, "b": 1.0, "c": 1.0}
    # mean 11/3: a -> 0; new -> 1; b -> 2; c -> 2
    assert deal(units, 3, known) == [["a"], ["new"], ["b", "c"]]
    # were it free, it would share a part with b
    assert deal(units, 3, known | {"new": 0.0}) == [["a"], ["b", "new"], ["c"]]


def test_a_group_without_units_is_not_split() -> None:
    planned = [_spec(n) for n in NAMES]
    assert [s for _, s in shard(planned, None, 0, 1)] == planned
    with pytest.raises(ValueError, match="cannot be split"):
        shard(planned, None, 0, 2)


@pytest.mark.parametrize(("text", "expected"), [("0/1", (0, 1)), ("3/4", (3, 4)), ("1/2", (1, 2))])
def test_parse_shard(text: str, expected: tuple[int, int]) -> None:
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["4/4", "-1/2", "1", "a/b", "0/0", "1/"])
def test_parse_shard_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="I/N"):
        parse_shard(text)
