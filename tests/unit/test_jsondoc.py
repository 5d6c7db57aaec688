"""The JSON every reader shares: what is not JSON is refused as `NotJSON`, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from envbuilder.aggregate.results import Rejected, read_results
from envbuilder.errors import InputError
from envbuilder.jsondoc import NotJSON, parse
from envbuilder.lockfile.read import load_lockfile


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": Infinity}', "Infinity is not a JSON number"),
        ("[-Infinity]", "-Infinity is not a JSON number"),
        ('{"x": ' + "9" * 4301 + "}", "Exceeds the limit (4300 digits)"),
        ("[" * 200 + "]" * 200, "nested deeper than 64 levels"),
        (b'{"x": "\xff"}', "not valid JSON"),
    ],
)
def test_what_is_not_json_is_refused_with_why(raw: str | bytes, why: str) -> None:
    with pytest.raises(NotJSON, match="^" + "(not valid JSON|JSON nested)") as caught:
        parse(raw)
    assert why in str(caught.value)
    assert "not valid JSON (not valid JSON" not in str(caught.value)


@pytest.mark.parametrize("value", [0.5, -1e308, 10**4000, 0, "NaN", None])
def test_json_numbers_and_strings_are_read_back(value: object) -> None:
    assert parse(json.dumps({"x": value})) == {"x": value}


def test_a_number_no_double_holds_is_refused() -> None:
    # 1e999 is JSON's syntax, but Python would read it as inf, which no writer accepts back.
    with pytest.raises(NotJSON, match="1e999 overflows a double"):
        parse("[1e999]")
    assert not math.isinf(parse("[1e308]")[0])


@pytest.mark.parametrize(
    "planted", ["NaN", "Infinity", "-Infinity", "9" * 5000], ids=["nan", "inf", "-inf", "huge"]
)
def test_a_lockfile_with_a_non_json_number_names_the_file(tmp_path: Path, planted: str) -> None:
    path = tmp_path / "compat.lock.json"
    path.write_text('{"schema": "envbuilder.compat/2", "duration_s": ' + planted + "}")
    with pytest.raises(InputError, match=f"^{path}: not valid JSON"):
        load_lockfile(path)


@pytest.mark.parametrize("planted", ["NaN", "1" * 4400])
def test_a_results_file_with_a_non_json_number_is_rejected(tmp_path: Path, planted: str) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"schema": "envbuilder.results/2", "duration_s": ' + planted + "}")
    with pytest.raises(Rejected, match="not valid JSON"):
        read_results(path)
