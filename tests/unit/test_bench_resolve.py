"""The resolve benchmark's anchor project and its exit status."""

from __future__ import annotations

import tomllib

import pytest

from envbuilder.bench.resolve import Check, anchor_project, exit_status

PAIRINGS = {
    "torch-2-4-1-xformers-0-0-28-post1": ["torch==2.4.1", "xformers==0.0.28.post1"],
    "torch-2-11-0": ["torch==2.11.0"],
}


def test_the_anchor_declares_one_conflicting_extra_per_pairing() -> None:
    doc = tomllib.loads(
        anchor_project(
            PAIRINGS, pythons=["3.10", "3.13", "3.11"], index_url="http://127.0.0.1:1/simple"
        )
    )
    assert doc["project"]["requires-python"] == ">=3.10,<3.14"
    assert doc["project"]["optional-dependencies"] == PAIRINGS
    assert doc["tool"]["uv"]["conflicts"] == [[{"extra": name} for name in PAIRINGS]]
    assert doc["tool"]["uv"]["environments"] == [
        "sys_platform == 'linux' and platform_machine == 'x86_64'"
    ]
    assert doc["tool"]["uv"]["index"] == [{"url": "http://127.0.0.1:1/simple", "default": True}]


def test_one_pairing_declares_no_conflict() -> None:
    one = {"torch-2-11-0": ["torch==2.11.0"]}
    doc = tomllib.loads(anchor_project(one, pythons=["3.12"], index_url="http://127.0.0.1:1/s"))
    assert "conflicts" not in doc["tool"]["uv"]


MET = Check(text="a", target="t", ok=True)
MISSED = Check(text="b", target="t", ok=False)


@pytest.mark.parametrize(
    ("checks", "failures", "rc"),
    [
        ([MET, MET], 0, 0),
        ([MET, MISSED], 0, 1),
        ([MET, MET], 1, 1),
        ([], 0, 0),
    ],
)
def test_a_missed_target_or_a_failed_run_exits_non_zero(
    checks: list[Check], failures: int, rc: int
) -> None:
    assert exit_status(checks, failures) == rc
