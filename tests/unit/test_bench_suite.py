"""The suite benchmark's verdicts: each run against its goal, and the exit status."""

from __future__ import annotations

from typing import Any

from envbuilder.bench.suite import ANCHORS, GOALS, Timed, report


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
