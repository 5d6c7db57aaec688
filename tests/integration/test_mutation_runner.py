"""`nox -s mutants`' verdicts on a small tree of its own: a plant its tests fail on is
killed, one they pass on survived (exit 1), and one whose tests were all skipped here
(no Docker, no fish) is "not run here" with the skip's reason, which fails nothing."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.mutation import run as mutants

MODULE = "def double(x):\n    return 2 * x\n"
TESTS = {
    "test_double.py": """
        from double import double

        def test_double():
            assert double(3) == 6
        """,
    "test_elsewhere.py": """
        import pytest
        from double import double

        def test_double_on_a_frobnicator():
            pytest.skip("no frobnicator here")
            assert double(3) == 6
        """,
    "test_wrong.py": """
        from double import double

        def test_double_of_two():
            assert double(2) == 5
        """,
    "test_weak.py": """
        from double import double

        def test_double_is_a_number():
            assert isinstance(double(3), int)
        """,
}


def _plant(name: str, test: str) -> str:
    return textwrap.dedent(f"""
        [{name}]
        file = "double.py"
        find = "2 * x"
        replace = "3 * x"
        tests = ["{test}"]
        why = "double triples"
        """)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "double.py").write_text(MODULE)
    for name, text in TESTS.items():
        (root / name).write_text(textwrap.dedent(text))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.setattr(mutants, "ROOT", root)
    return root


@pytest.mark.parametrize(
    ("test", "rc", "said"),
    [
        ("test_double.py", 0, "✓ killed   triple"),
        ("test_weak.py", 1, "✕ SURVIVED triple"),
        ("test_elsewhere.py", 0, "- not run here triple: 1 skipped (no frobnicator here)"),
    ],
    ids=["killed", "survived", "skipped"],
)
def test_each_plant_gets_its_verdict(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], test: str, rc: int, said: str
) -> None:
    plants = tmp_path / "plants.toml"
    plants.write_text(_plant("triple", test))
    assert mutants.main(["--plants", str(plants)]) == rc
    out = capsys.readouterr().out
    assert said in out, out
    assert (double := tree / "double.py").read_text() == MODULE, double


def test_the_summary_counts_plants_not_run_apart(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plants = tmp_path / "plants.toml"
    plants.write_text(_plant("a", "test_double.py") + _plant("b", "test_elsewhere.py"))
    assert mutants.main(["--plants", str(plants)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "1 of 2 planted bugs killed, 0 survived, 0 broken, 1 not run here", last


def test_a_baseline_failure_names_the_failing_test(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plants = tmp_path / "plants.toml"
    plants.write_text(_plant("a", "test_double.py") + _plant("b", "test_wrong.py"))
    assert mutants.main(["--plants", str(plants)]) == 2
    err = capsys.readouterr().err
    assert "FAILED test_wrong.py::test_double_of_two" in err, err
