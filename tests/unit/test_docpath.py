"""Names from documents: a build key or a wheel file name becomes part of a path only when
it is one, and the joined path never leaves its root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuilder.docpath import UnsafeName, checked_name, document_path

KEY = "0123456789abcdef" * 4
WHEEL = "xformers-0.0.35+cu130-py39-none-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize(
    ("kind", "value", "ok"),
    [
        ("key", KEY, True),
        ("key", KEY.upper(), False),
        ("key", KEY[:-1], False),
        ("key", KEY + "0", False),
        ("key", "./././././../../victim", False),
        ("key", "..", False),
        ("key", "", False),
        ("key", None, False),
        ("key", 12, False),
        ("wheel", WHEEL, True),
        ("wheel", "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl", True),
        ("wheel", "x-1.0-1build-py3-none-any.whl", True),
        ("wheel", "../../x.whl", False),
        ("wheel", "../victim/x-1.0-py3-none-any.whl", False),
        ("wheel", "/tmp/x-1.0-py3-none-any.whl", False),
        ("wheel", "x-1.0-py3-none-any.whl/..", False),
        ("wheel", "x-1.0-py3-none-any.tar.gz", False),
        ("wheel", "x-1.0-py3-none-any.whl\n", False),
        ("wheel", "x-1.0-py3-none-any.whl\0", False),
        ("wheel", ".whl", False),
        ("wheel", "x.whl", False),
        ("wheel", "x-1.0-py3-none-any-extra-part.whl", False),
        ("wheel", "x-" + "1" * 300 + "-py3-none-any.whl", False),
        ("wheel", ["x-1.0-py3-none-any.whl"], False),
    ],
)
def test_a_name_is_one_of_its_kind_or_refused_quoting_it(
    kind: str, value: object, ok: bool
) -> None:
    if ok:
        assert checked_name(kind, value, source="the record") == value  # type: ignore[arg-type]
        return
    with pytest.raises(UnsafeName) as refused:
        checked_name(kind, value, source="the record")  # type: ignore[arg-type]
    assert str(refused.value).startswith(f"the record names {value!r} where ")


def test_a_path_through_a_planted_link_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / KEY).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeName, match="leads outside"):
        document_path(root, ("key", KEY), ("wheel", WHEEL), source="the lockfile")
    assert document_path(root, ("key", "f" * 64), source="x") == root / ("f" * 64)


_HOSTILE_PARTS = st.sampled_from(["..", ".", "/", "\\", "\0", "\n", "~", "%2e", "", " "])
_HOSTILE = st.lists(
    st.one_of(_HOSTILE_PARTS, st.text(min_size=1, max_size=8)), min_size=1, max_size=8
).map("".join)


@given(key=_HOSTILE, wheel=_HOSTILE)
def test_no_generated_name_leads_outside_the_root(key: str, wheel: str) -> None:
    root = Path("/nonexistent-root/cache")
    for names in ((("key", key),), (("key", KEY), ("wheel", wheel)), (("wheel", wheel),)):
        try:
            path = document_path(root, *names, source="generated")
        except UnsafeName:
            continue
        assert path.parent in (root, root / KEY)
        assert ".." not in path.parts and "\0" not in str(path) and "\n" not in str(path)
        assert os.path.normpath(path) == str(path)
