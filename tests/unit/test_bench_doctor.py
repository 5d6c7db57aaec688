"""The doctor bench's goals: each run against its anchor in the same round."""

from __future__ import annotations

import pytest

from envbuilder.bench.doctor import ratios, table


def _round(first: float, warm: float, fast: float) -> dict[str, float]:
    return {"anchor cold": 10.0, "first": first, "anchor warm": 8.0, "warm": warm,
            "import": 6.0, "fast": fast}  # fmt: skip


@pytest.mark.parametrize(
    ("rounds", "missed"),
    [
        ([_round(19.0, 9.0, 5.0)], []),
        ([_round(21.0, 9.0, 5.0)], ["first"]),
        ([_round(19.0, 10.5, 6.5)], ["warm", "fast"]),
        # the median of the rounds' ratios decides, not one slow round
        ([_round(19.0, 9.0, 5.0), _round(30.0, 9.0, 5.0), _round(18.0, 9.0, 5.0)], []),
    ],
)
def test_a_goal_is_missed_when_the_median_ratio_exceeds_it(
    rounds: list[dict[str, float]], missed: list[str]
) -> None:
    found = ratios(rounds)
    assert [r.arm for r in found if not r.met] == missed
    lines = table(found)
    assert [line.split()[0] for line in lines[1:]] == ["first", "warm", "fast"]
    assert sum("MISSED" in line for line in lines) == len(missed)
