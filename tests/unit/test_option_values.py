"""A mistyped value of a closed option is refused with the nearest one suggested."""

from __future__ import annotations

import pytest

from envbuilder.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["query", "--use", "inferenc"],
            "argument --use: invalid choice 'inferenc'; did you mean 'inference'? (choose from "
            "inference, inference-compiled, training, training-compiled)",
        ),
        (
            ["install", "--installer", "pipp", "--dry-run"],
            "argument --installer: invalid choice 'pipp'; did you mean 'pip'?",
        ),
        (
            ["export", "x", "--format", "requirement"],
            "argument --format: invalid choice 'requirement'; did you mean 'requirements'?",
        ),
        (["query", "--use", "zzz"], "argument --use: invalid choice 'zzz' (choose from "),
    ],
)
def test_a_typo_gets_the_nearest_value(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err
