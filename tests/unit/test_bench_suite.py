"""The suite benchmark's verdicts: each run against its goal, and the exit status."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from envbuilder.bench.suite import (
    ANCHORS,
    GOALS,
    Timed,
    committed_run,
    report,
    status_changes,
)


def _timed(size: str, wall: float, results: dict[str, Any] | None = None) -> Timed:
    return Timed(
        label=size,
        size=size,
        wall_s=wall,
        status=0,
        results={"checks": [], "runner": {"launch": {}}} if results is None else results,
        cold_page_cache=True,
    )


def test_goals_and_anchors_are_the_issues() -> None:
    assert GOALS == {"quick": 30.0, "full": 120.0}
    assert ANCHORS == {"quick": 38.0, "full": 200.0}


def test_each_run_is_judged_against_its_own_goal() -> None:
    lines, met = report([_timed("quick", 29.0), _timed("full", 119.0)])
    assert met
    assert "0.76×  met" in lines[1]  # 29 s against the 38 s anchor
    lines, met = report([_timed("quick", 31.0), _timed("full", 100.0)])
    assert not met
    assert lines[1].endswith("MISSED")


def test_a_run_without_results_misses_its_goal() -> None:
    run = Timed(
        label="full", size="full", wall_s=5.0, status=3, results=None, cold_page_cache=False
    )
    lines, met = report([run])
    assert not met
    assert "NO RESULTS (page cache warm: not root)" in lines[1]


def _checks(**statuses: str) -> dict[str, Any]:
    return {"checks": [{"name": n.replace("_", "."), "status": s} for n, s in statuses.items()]}


@pytest.mark.parametrize(
    ("before", "now", "changes"),
    [
        (_checks(a_x="pass", b_y="fail"), _checks(a_x="pass", b_y="fail"), []),
        (_checks(a_x="pass", b_y="fail"), _checks(a_x="fail", b_y="fail"), ["a.x: pass -> fail"]),
        (_checks(a_x="pass"), _checks(a_x="pass", c_z="skip"), ["c.z: absent -> skip"]),
        (_checks(a_x="pass", c_z="skip"), _checks(a_x="pass"), ["c.z: skip -> absent"]),
    ],
)
def test_statuses_are_compared_per_check(
    before: dict[str, Any], now: dict[str, Any], changes: list[str]
) -> None:
    assert status_changes(now, before) == changes


def test_a_changed_status_misses_the_goal_and_is_listed(tmp_path: Path) -> None:
    row = "py3.12-cu130-torch2.11.0"
    runner = {"launch": {}, "gpus": [{"name": "NVIDIA H200"}]}
    (tmp_path / f"{row}.h200.quick.json").write_text(json.dumps(_checks(a_x="pass")))
    now = {**_checks(a_x="fail"), "combination": row, "runner": runner}
    assert committed_run(now, "quick", tmp_path) == tmp_path / f"{row}.h200.quick.json"
    assert committed_run(now, "full", tmp_path) is None  # no committed full run here
    run = replace(_timed("quick", 20.0, now), status_changes=("a.x: pass -> fail",),
                  compared_with=str(tmp_path / f"{row}.h200.quick.json"))  # fmt: skip
    lines, met = report([run])
    assert not met
    assert lines[1].endswith("MISSED")
    assert "      a.x: pass -> fail" in lines


def test_a_run_with_carried_caches_is_shown_not_judged() -> None:
    carried = replace(_timed("quick", 45.0), label="quick warm", carried_caches=True)
    lines, met = report([_timed("quick", 29.0), carried])
    assert met
    assert "caches carried, not judged" in lines[2]


def test_a_committed_run_is_found_by_the_gpu_model_then_by_its_compute_capability(
    tmp_path: Path,
) -> None:
    row = "py3.12-cu130-torch2.11.0-xformers0.0.35"
    h200 = {"gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}]}
    for name in (f"{row}.h200.json", f"{row}.h200.quick.json", f"{row}-cudart.a100.json"):
        (tmp_path / name).write_text(json.dumps({**_checks(a_x="pass"), "runner": h200}))
    (tmp_path / f"{row}.h100.json").write_text(json.dumps(_checks(a_x="pass")))

    def now(gpu: str, cc: str) -> dict[str, Any]:
        runner = {"gpus": [{"name": gpu, "compute_capability": cc}]}
        return {"combination": row, "runner": runner}

    # the model, not the name's last word ("HBM3")
    h100 = now("NVIDIA H100 80GB HBM3", "9.0")
    assert committed_run(h100, "full", tmp_path) == tmp_path / f"{row}.h100.json"
    (tmp_path / f"{row}.h100.json").unlink()
    # no run on this model: one on a GPU of the same compute capability, of the same size
    assert committed_run(h100, "full", tmp_path) == tmp_path / f"{row}.h200.json"
    assert committed_run(h100, "quick", tmp_path) == tmp_path / f"{row}.h200.quick.json"
    # another capability's kernels differ: nothing to compare with
    assert committed_run(now("NVIDIA A100-SXM4-80GB", "8.0"), "full", tmp_path) is None
