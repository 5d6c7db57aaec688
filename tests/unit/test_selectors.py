"""Selectors: which combinations each picks, and the errors for the ones that pick nothing."""

from __future__ import annotations

import pytest

from envbuilder.errors import InputError
from envbuilder.model import Combination
from envbuilder.resolve.selectors import select
from envbuilder.target import parse_cuda_build


def combo(
    python: str, cuda: str, torch: str, xformers: str | None, cudart: bool = False
) -> Combination:
    parts = [f"py{python}", cuda, f"torch{torch}"]
    parts += [f"xformers{xformers}"] if xformers else []
    parts += ["cudart"] if cudart else []
    return Combination(
        id="-".join(parts),
        python=python,
        cuda=parse_cuda_build(cuda) or "default",
        torch=torch,
        xformers=xformers,
        add_cuda_runtime=cudart,
    )


MATRIX = (
    combo("3.10", "cu121", "2.4.1", "0.0.28.post1"),
    combo("3.11", "cu121", "2.4.1", "0.0.28.post1"),
    combo("3.11", "cu124", "2.5.0", "0.0.28"),
    combo("3.12", "cu124", "2.5.1", "0.0.28.post3"),
    combo("3.12", "cu130", "2.50.0", None),
    combo("3.12", "cu130", "2.11.0", "0.0.35", cudart=True),
    combo("3.11", "cpu", "2.13.0", None),
    combo("3.11", "default", "2.4.1", "0.0.28.post1"),
)


def ids(*indexes: int) -> list[str]:
    return [MATRIX[i].id for i in indexes]


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        ([], ids(0, 1, 2, 3, 4, 5, 6, 7)),
        (["cu121"], ids(0, 1)),
        (["12.1"], ids(0, 1)),
        (["13.0"], ids(4, 5)),
        (["cpu"], ids(6)),
        (["default"], ids(7)),
        (["py3.11"], ids(1, 2, 6, 7)),
        (["torch2.5"], ids(2, 3)),  # 2.5.0 and 2.5.1, not 2.50.0
        (["torch2.5.1"], ids(3)),
        (["torch2"], ids(0, 1, 2, 3, 4, 5, 6, 7)),
        (["xformers0.0.28"], ids(0, 1, 2, 3, 7)),  # post releases share the release segments
        (["xformers0.0.28.post1"], ids(0, 1, 7)),
        (["cudart"], ids(5)),
        (["py3.11-cu121-torch2.4.1-xformers0.0.28.post1"], ids(1)),
        (["py3.1?-cu12*"], ids(0, 1, 2, 3)),
        (["*-cpu-*"], ids(6)),
        (["py3.11-torch2.4"], ids(1, 7)),  # atoms joined by '-' must all hold
        (["cpu", "cu130"], ids(4, 5, 6)),  # union, in the matrix's order
        (["py3.12", "cu124"], ids(2, 3, 4, 5)),
    ],
)
def test_selector_picks(selectors: list[str], expected: list[str]) -> None:
    assert [c.id for c in select(MATRIX, selectors)] == expected


@pytest.mark.parametrize(
    ("selectors", "message"),
    [
        (["cu118"], "selector 'cu118' matches no combination"),
        (["py3.9"], "selector 'py3.9' matches no combination"),
        (
            ["py3.11-cu121-torch2.4.1-xformers0.0.28.post2"],
            "did you mean 'py3.11-cu121-torch2.4.1-xformers0.0.28.post1'",
        ),
        (["3.11"], "for Python write 'py3.11'"),
        (["gpu"], "selector 'gpu': 'gpu' is not a selector"),
        (["torchX"], "'torchX' is not a selector"),
        (["nothing*"], "selector 'nothing*' matches no combination"),
    ],
)
def test_bad_selectors_are_input_errors(selectors: list[str], message: str) -> None:
    with pytest.raises(InputError) as info:
        select(MATRIX, selectors)
    assert info.value.return_code == 2
    assert message in str(info.value)


def test_every_bad_selector_is_reported_at_once() -> None:
    with pytest.raises(InputError) as info:
        select(MATRIX, ["cu118", "cpu", "gpu"])
    assert str(info.value).splitlines()[0].startswith("selector 'gpu'")
    assert "selector 'cu118' matches no combination" in str(info.value)
