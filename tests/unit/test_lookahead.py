"""The relay's guesses of what uv reads next: the projects metadata requires, the wheels a
page's releases offer each Python."""

from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet

from envbuilder.index.lookahead import likely_wheels, pythons_of, required


def _metadata(*requires: str) -> bytes:
    lines = ["Metadata-Version: 2.1", "Name: demo", "Version: 1.0"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n\nThe description.\n").encode()


def test_required_keeps_markers_but_not_extras_and_names_are_normalised() -> None:
    found = required(
        _metadata(
            "Typing_Extensions>=4.8",
            'tomli>=1.1; python_version < "3.11"',
            'pytest>=8; extra == "test"',
            "not a requirement ~~",
            "sympy==1.13.1",
        )
    )
    assert found == [
        ("typing-extensions", SpecifierSet(">=4.8")),
        ("tomli", SpecifierSet(">=1.1")),
        ("sympy", SpecifierSet("==1.13.1")),
    ]


def test_required_of_metadata_without_requirements_or_garbage_is_empty() -> None:
    assert required(_metadata()) == []
    assert required(b"\xff\xfe not metadata") == []


def _wheel(version: str, tags: str = "py3-none-any", **extra: Any) -> dict[str, Any]:
    return {"filename": f"demo-{version}-{tags}.whl", **extra}


def test_the_newest_release_each_python_admits_and_its_own_wheel() -> None:
    files = [
        _wheel("1.0", "cp310-cp310-manylinux_2_17_x86_64"),
        _wheel("1.0", "cp312-cp312-manylinux_2_17_x86_64"),
        _wheel("2.0", "cp311-cp311-manylinux_2_17_x86_64", **{"requires-python": ">=3.11"}),
        _wheel("2.0", "cp312-cp312-manylinux_2_17_x86_64", **{"requires-python": ">=3.11"}),
        {"filename": "demo-3.0.tar.gz"},  # an sdist: not a wheel whose metadata is read
        _wheel("3.0rc1", "cp312-cp312-manylinux_2_17_x86_64"),  # a pre-release
        _wheel("2.5", "cp312-cp312-manylinux_2_17_x86_64", yanked="broken"),
    ]
    chosen = likely_wheels(files, specifier=SpecifierSet(), pythons=["3.10", "3.11", "3.12"])
    assert [w["filename"] for w in chosen] == [
        "demo-1.0-cp310-cp310-manylinux_2_17_x86_64.whl",  # 2.0 requires Python 3.11
        "demo-2.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        "demo-2.0-cp312-cp312-manylinux_2_17_x86_64.whl",
    ]


def test_the_requirement_s_specifier_bounds_the_release() -> None:
    files = [_wheel("1.13.1"), _wheel("1.14.0"), _wheel("2.0")]
    pinned = likely_wheels(files, specifier=SpecifierSet("==1.13.1"), pythons=["3.12"])
    assert [w["filename"] for w in pinned] == ["demo-1.13.1-py3-none-any.whl"]
    below = likely_wheels(files, specifier=SpecifierSet("<2"), pythons=["3.12"])
    assert [w["filename"] for w in below] == ["demo-1.14.0-py3-none-any.whl"]
    assert likely_wheels(files, specifier=SpecifierSet(">3"), pythons=["3.12"]) == []


def test_one_pure_wheel_serves_every_python_once() -> None:
    files = [_wheel("1.0"), _wheel("1.0", "py2.py3-none-any")]
    chosen = likely_wheels(files, specifier=SpecifierSet(), pythons=["3.10", "3.13"])
    assert [w["filename"] for w in chosen] == ["demo-1.0-py3-none-any.whl"]


def test_a_malformed_requires_python_admits_and_a_bad_filename_is_skipped() -> None:
    files = [
        {"filename": "not-a-wheel-name.whl"},
        _wheel("1.0", **{"requires-python": "three point ten"}),
    ]
    chosen = likely_wheels(files, specifier=SpecifierSet(), pythons=["3.10"])
    assert [w["filename"] for w in chosen] == ["demo-1.0-py3-none-any.whl"]


def test_a_wheel_whose_tags_do_not_parse_still_counts_for_its_release() -> None:
    # only the version is read from each filename; the tags only of the release chosen
    odd = {"filename": "demo-2.0-x-cp310-cp310-manylinux_2_17_x86_64.whl"}  # a bad build tag
    files = [_wheel("1.0", "cp310-cp310-manylinux_2_17_x86_64"), odd]
    assert likely_wheels(files, specifier=SpecifierSet(), pythons=["3.10"]) == [odd]
    bounded = likely_wheels(files, specifier=SpecifierSet("<2"), pythons=["3.10"])
    assert [w["filename"] for w in bounded] == ["demo-1.0-cp310-cp310-manylinux_2_17_x86_64.whl"]


def test_pythons_of_gives_sorted_distinct_minors() -> None:
    assert pythons_of({"3.12", "3.10", "3.12.1", "3.9"}) == ["3.9", "3.10", "3.12"]
    assert pythons_of(()) == []
