"""Workaround checks: run only after their direct check failed, on its case, recorded as
covering it; a crash inside one is still recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec, Outcome, Status, read_jsonl
from envbuilder.conformance.runner import GroupRun, settle
from envbuilder.conformance.worker import run_planned

CPU = Context(device="cpu", quick=False)

OUTCOMES: dict[Status, Outcome] = {
    "pass": Outcome.passed({"error": 0.0}),
    "fail": Outcome.failed("too far"),
    "invalid": Outcome.invalid("cannot tell"),
}


def _direct(status: Status, ran: list[str]) -> CheckSpec:
    def run(name: str, outcome: Outcome) -> Outcome:
        ran.append(name)
        return outcome

    spec = CheckSpec(
        name="compile.xformers.bias.static.fullgraph.bf16.backward",
        gate=True,
        uses=("training-compiled",),
        impl="sdpa",  # no xformers needed here: the mechanism is what is tested
        run=lambda: run("direct", OUTCOMES[status]),
    )
    workarounds = (
        spec.covered_by(
            "dynamo-disable",
            lambda: run("dynamo-disable", Outcome.passed({"graph_breaks": 1, "step_ms": 2.0})),
            "sdpa",
        ),
        spec.covered_by(
            "sdpa-under-compile",
            lambda: run("sdpa", Outcome.passed({"graph_breaks": 0, "step_ms": 1.0})),
            "sdpa",
        ),
    )
    return CheckSpec(**{**spec.__dict__, "workarounds": workarounds})


@pytest.mark.parametrize(
    ("status", "ran"),
    [
        ("pass", ["direct"]),
        ("fail", ["direct", "dynamo-disable", "sdpa"]),
        ("invalid", ["direct", "dynamo-disable", "sdpa"]),
    ],
)
def test_workarounds_run_only_when_the_direct_check_failed(
    tmp_path: Path, status: Status, ran: list[str]
) -> None:
    seen: list[str] = []
    spec = _direct(status, seen)
    jsonl, state = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    assert run_planned([spec], CPU, jsonl=jsonl, state=state) == 0
    assert seen == ran
    records = read_jsonl(jsonl)
    assert records[0]["covers"] is None and records[0]["workaround"] is None
    for record in records[1:]:
        assert record["covers"] == spec.name
        assert record["uses"] == ["training-compiled"]
        assert record["name"].startswith(spec.name + ".")
    metas = [x["meta"] for x in read_jsonl(state) if "meta" in x]
    assert [m["covers"] for m in metas] == [spec.name] * (len(ran) - 1)


def test_a_restarted_worker_runs_only_the_missing_workarounds(tmp_path: Path) -> None:
    seen: list[str] = []
    spec = _direct("fail", seen)
    jsonl, state = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    run_planned([spec], CPU, jsonl=jsonl, state=state)
    kept = jsonl.read_text().splitlines()[:2]  # the direct result and the first workaround
    jsonl.write_text("\n".join(kept) + "\n")
    seen.clear()
    run_planned([spec], CPU, jsonl=jsonl, state=state)
    assert seen == ["sdpa"]


def test_a_crash_in_a_workaround_check_is_recorded_with_what_it_covers() -> None:
    direct = _direct("fail", [])
    workaround = direct.workarounds[0]
    run = GroupRun(
        plan=(direct.meta(),),
        started=(direct.name, workaround.name),
        unplanned={workaround.name: workaround.meta()},
        done=frozenset({direct.name}),
        exit_status=-11,
        log_tail="",
    )
    records, _ = settle("compile", run, limit_s=60, elapsed_s=1)
    assert [(r.name, r.status, r.covers, r.workaround) for r in records] == [
        (workaround.name, "error", direct.name, "dynamo-disable")
    ]
    assert records[0].uses == ("training-compiled",)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"uses": ("training", "inference")}, "in ('inference'"),
        ({"uses": ("inference", "inference")}, "distinct"),
        ({"uses": ()}, "names the uses"),
        ({"uses": ("inference",), "workaround": "dynamo-disable"}, "covers"),
        ({"uses": ("inference",), "covers": "attention.x"}, "covers"),
    ],
)
def test_a_check_spec_refuses_inconsistent_tags(kwargs: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        CheckSpec(name="attention.x.y", gate=True, run=Outcome.passed, **kwargs)  # type: ignore[arg-type]
