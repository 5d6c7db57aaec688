"""Every reader of a file or page, fed generated and mutated inputs (hypothesis).

Each reader starts from a real document (the synthetic data in tests/data, a
matrix, a Simple API page) and gets it back mutated - a value replaced by any
JSON value, a key dropped, the bytes cut short or spliced - besides plain
random bytes. Whatever it is given, a reader either reads it or refuses it
with the project's own error naming the input: no other exception (no
traceback), no hang (a per-input deadline) and nothing written beside the
input. Inputs per reader: the Hypothesis profile's count (tests/conftest.py: 100,
1,000 in CI).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuilder.aggregate.results import Rejected, read_results
from envbuilder.cli import main
from envbuilder.errors import EnvbuilderError
from envbuilder.index.simple import parse_project_page
from envbuilder.lockfile.canonical import seal
from envbuilder.lockfile.read import load_lockfile
from envbuilder.model import load_resolution
from envbuilder.pylock import packages, read_lock, select, tool_table
from envbuilder.resolve.matrix import load_matrix
from envbuilder.target import Target

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
GENERATED = settings(  # max_examples: the profile's (tests/conftest.py)
    deadline=timedelta(seconds=5),  # a reader that hangs fails here
    database=None,
    derandomize=True,  # the same inputs in every CI run
    # one scratch directory serves every input of a test: each input overwrites the same file
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
# TOML has no null; everything else of JSON it can carry
TOML_VALUES = st.recursive(
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


def _apply(document: Any, path: tuple[Any, ...], op: str, value: Any) -> Any:
    """``document`` with the node at ``path`` replaced by ``value``, dropped, or doubled."""
    if not path:
        return value if op == "replace" else document
    head, rest = path[0], path[1:]
    if isinstance(document, dict) and head in document:
        copy = dict(document)
        if rest:
            copy[head] = _apply(copy[head], rest, op, value)
        elif op == "drop":
            del copy[head]
        elif op == "replace":
            copy[head] = value
        else:
            copy[head] = [copy[head], copy[head]]
        return copy
    if isinstance(document, list) and isinstance(head, int) and head < len(document):
        items = list(document)
        if rest:
            items[head] = _apply(items[head], rest, op, value)
        elif op == "drop":
            del items[head]
        elif op == "replace":
            items[head] = value
        else:
            items.insert(head, items[head])
        return items
    return document


def _mutated_documents(seed: Any, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    paths = list(_paths(seed))
    edit = st.tuples(st.sampled_from(paths), st.sampled_from(["replace", "drop", "double"]), values)

    def apply_all(edits: list[tuple[tuple[Any, ...], str, Any]]) -> Any:
        document = seed
        for path, op, value in edits:
            document = _apply(document, path, op, value)
        return document

    return st.lists(edit, min_size=1, max_size=3).map(apply_all)


def _spliced(data: bytes) -> st.SearchStrategy[bytes]:
    """The bytes cut short, or with a random run of bytes put in or over them."""
    cut = st.integers(0, len(data)).map(lambda n: data[:n])
    splice = st.tuples(st.integers(0, len(data)), st.integers(0, 8), st.binary(max_size=16)).map(
        lambda t: data[: t[0]] + t[2] + data[t[0] + t[1] :]
    )
    return cut | splice


def _json_inputs(seed_bytes: bytes, *, reseal: bool = False) -> st.SearchStrategy[bytes]:
    seed = json.loads(seed_bytes)

    def dump(document: Any) -> bytes:
        if reseal and isinstance(document, dict):
            return seal(document)
        return json.dumps(document).encode()

    return st.one_of(
        _mutated_documents(seed, JSON_VALUES).map(dump),
        _spliced(seed_bytes),
        st.binary(max_size=200),
        st.just(b"[" * 100_000),
    )


def _toml_inputs(seed_bytes: bytes) -> st.SearchStrategy[bytes]:
    seed = tomllib.loads(seed_bytes.decode())

    def dump(document: Any) -> bytes:
        return tomli_w.dumps(document).encode() if isinstance(document, dict) else b"x = ["

    return st.one_of(
        _mutated_documents(seed, TOML_VALUES).map(dump),
        _spliced(seed_bytes),
        st.binary(max_size=200),
        st.just(b"a = " + b"[" * 100_000),
    )


def _read_or_refuse(
    directory: Path,
    name: str,
    data: bytes,
    read: Callable[[Path], object],
    errors: tuple[type[Exception], ...] = (EnvbuilderError,),
) -> None:
    """``read`` of ``data`` at ``directory/name`` either succeeds or raises one of
    ``errors`` with a message naming the file; either way nothing else is written."""
    path = directory / name
    path.write_bytes(data)
    try:
        read(path)
    except errors as e:
        assert str(path) in str(e) or name in str(e), f"the error does not name the file: {e}"
    assert sorted(p.name for p in directory.iterdir()) == [name]
    assert path.read_bytes() == data


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="envbuilder-generated-") as tmp:
        yield Path(tmp)


@pytest.fixture
def scratch(workdir: Path) -> Iterator[Path]:
    """An empty directory for one reader's inputs (shared by its generated examples)."""
    directory = Path(tempfile.mkdtemp(dir=workdir))
    yield directory
    shutil.rmtree(directory)


# -- matrix.toml ------------------------------------------------------------------------------


def _read_matrix(path: Path) -> None:
    matrix = load_matrix(path, environ={})
    matrix.select(())


@GENERATED
@given(data=_toml_inputs((ROOT / "matrix.toml").read_bytes()))
def test_matrix_toml(scratch: Path, data: bytes) -> None:
    _read_or_refuse(scratch, "matrix.toml", data, _read_matrix)


# -- resolution.json --------------------------------------------------------------------------


@GENERATED
@given(data=_json_inputs((DATA / "locks" / "resolution.json").read_bytes()))
def test_resolution_json(scratch: Path, data: bytes) -> None:
    _read_or_refuse(scratch, "resolution.json", data, load_resolution)


# -- conformance results files ----------------------------------------------------------------

RESULTS_SEED = sorted((DATA / "results").glob("*.json"))[0].read_bytes()


@GENERATED
@given(data=_json_inputs(RESULTS_SEED))
def test_results_file(scratch: Path, data: bytes) -> None:
    _read_or_refuse(scratch, "results.json", data, read_results, (Rejected,))


# -- compat.lock.json -------------------------------------------------------------------------


def _compat_lock_seed() -> bytes:
    with tempfile.TemporaryDirectory(prefix="envbuilder-seed-") as tmp:
        out = Path(tmp) / "compat.lock.json"
        args = ["lock", "--resolution", str(DATA / "locks" / "resolution.json")]
        assert main([*args, "--results", str(DATA / "results"), "-o", str(out)]) == 0
        return out.read_bytes()


COMPAT_SEED = _compat_lock_seed()


@GENERATED
@given(data=st.one_of(_json_inputs(COMPAT_SEED, reseal=True), _json_inputs(COMPAT_SEED)))
def test_compat_lock_json(scratch: Path, data: bytes) -> None:
    def read(path: Path) -> None:
        compat = load_lockfile(path)
        compat.by_id()

    _read_or_refuse(scratch, "compat.lock.json", data, read)


# -- pylocks ----------------------------------------------------------------------------------

PYLOCK_SEED = (DATA / "locks" / "pylock.py3.11-default-torch2.9.0.toml").read_bytes()


@GENERATED
@given(data=_toml_inputs(PYLOCK_SEED))
def test_pylock(scratch: Path, data: bytes) -> None:
    def read(path: Path) -> None:
        lock = read_lock(path.read_bytes(), source=path)
        tool_table(lock)
        packages(lock, source=path)
        select(lock, Target(python="3.11"), source=path)

    _read_or_refuse(scratch, "pylock.toml", data, read)


# -- index pages ------------------------------------------------------------------------------

PAGE_URL = "https://index.invalid/simple/torch/"
WHEEL = "torch-2.4.1-cp311-cp311-manylinux_2_28_x86_64.whl"
JSON_PAGE = json.dumps(
    {
        "meta": {"api-version": "1.1"},
        "name": "torch",
        "files": [
            {
                "filename": WHEEL,
                "url": f"../../files/{WHEEL}",
                "hashes": {"sha256": "a" * 64},
                "requires-python": ">=3.9",
                "yanked": False,
                "core-metadata": {"sha256": "b" * 64},
                "size": 10,
            },
            {"filename": "torch-2.4.1.tar.gz", "url": "https://u:p@h/t.tar.gz", "hashes": {}},
        ],
        "versions": ["2.4.1"],
    }
).encode()
HTML_PAGE = (
    '<!DOCTYPE html><html><head><meta name="pypi:repository-version" content="1.0"></head>'
    f'<body><h1>Links for torch</h1><a href="../../files/{WHEEL}#sha256={"a" * 64}" '
    'data-requires-python="&gt;=3.9" data-core-metadata="sha256=bb">'
    f"{WHEEL}</a><br/>"
    '<a href="https://u:p@h/torch-2.4.1.tar.gz" data-yanked="">torch-2.4.1.tar.gz</a>'
    "</body></html>"
).encode()
HTML_TOKENS = ["<a ", "</a>", "href=", '"', "'", "<", ">", "/", "=", " ", "#sha256=", "</html>", "<base href=x>", "&amp;", "torch-2.4.1-py3-none-any.whl", "data-yanked", "Links for ", "\x00", "é"]  # fmt: skip
HTML_TEXT = st.lists(st.sampled_from(HTML_TOKENS), max_size=40).map(lambda t: "".join(t).encode())


def _read_page(content_type: str) -> Callable[[Path], object]:
    def read(path: Path) -> object:
        page = parse_project_page(
            path.read_bytes(), content_type=content_type, page_url=PAGE_URL, project="torch"
        )
        for file in page.files:
            parts = urlsplit(file.url)
            assert (parts.username, parts.password) == (None, None), "userinfo kept in a file URL"
        return page

    return read


def _named_page(read: Callable[[Path], object]) -> Callable[[Path], object]:
    """Page errors name the page's URL, not a file: check that, then re-raise as a file error."""

    def check(path: Path) -> object:
        try:
            return read(path)
        except EnvbuilderError as e:
            assert PAGE_URL in str(e), f"the error does not name the page: {e}"
            raise EnvbuilderError(f"{path}: {e}") from e

    return check


@GENERATED
@given(data=_json_inputs(JSON_PAGE))
def test_json_index_page(scratch: Path, data: bytes) -> None:
    read = _named_page(_read_page("application/vnd.pypi.simple.v1+json"))
    _read_or_refuse(scratch, "page.json", data, read)


@GENERATED
@given(data=st.one_of(_spliced(HTML_PAGE), HTML_TEXT, st.binary(max_size=200)))
def test_html_index_page(scratch: Path, data: bytes) -> None:
    read = _named_page(_read_page("text/html"))
    _read_or_refuse(scratch, "page.html", data, read)
