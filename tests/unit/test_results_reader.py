"""What `read_results` refuses: each rule is seen refusing a file that breaks only it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuilder.aggregate.results import Rejected, read_results

DATA = Path(__file__).parents[1] / "data"
GOOD = json.loads(
    (DATA / "results" / "py3.11-default-torch2.5.1-xformers0.0.28.post3.h100.json").read_text()
)


def duplicate_a_check(data: dict[str, Any]) -> None:
    data["checks"].append(copy.deepcopy(data["checks"][0]))


def nest_deeply(data: dict[str, Any]) -> None:
    value: Any = "x"
    for _ in range(80):
        value = [value]
    data["runner"]["extra"] = value


def newer_schema(data: dict[str, Any]) -> None:
    data["schema"] = "envbuilder.results/99"


def newer_suite(data: dict[str, Any]) -> None:
    data["suite_version"] = "99.0.0"


def unknown_status(data: dict[str, Any]) -> None:
    data["checks"][0]["status"] = "maybe"


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (duplicate_a_check, "check names are not unique"),
        (nest_deeply, "nested deeper than 64 levels"),
        (newer_schema, "upgrade envbuilder"),
        (newer_suite, "from a newer conformance suite"),
        (unknown_status, "fails the results schema"),
    ],
)
def test_a_file_breaking_one_rule_is_rejected_for_it(
    tmp_path: Path, damage: Callable[[dict[str, Any]], None], said: str
) -> None:
    data = copy.deepcopy(GOOD)
    damage(data)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(Rejected, match=said):
        read_results(path)


def test_the_undamaged_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(GOOD))
    assert read_results(path).data == GOOD
