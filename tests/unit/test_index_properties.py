"""Properties of the index readers that say what they mean, not only "no crash" (hypothesis).

A page's files are all kept, with their hashes; a zip member written is read back
byte-identical by the one-record reader, and a flipped byte is never returned as
the member; a member that inflates past the bound is refused before it fills
memory; non-UTF-8 or hostile metadata is refused with the project's error.
"""

from __future__ import annotations

import html
import io
import json
import zipfile
import zlib
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuilder.errors import IndexError_
from envbuilder.index import _zipentry
from envbuilder.index.remotewheel import RangeFile, check_metadata, read_by_directory
from envbuilder.index.simple import parse_project_page

PAGE_URL = "https://index.invalid/simple/demo/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
PROPERTIES = settings(
    max_examples=200,
    deadline=timedelta(seconds=5),
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

VERSIONS = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}", fullmatch=True)
TAGS = st.sampled_from(["py3-none-any", "cp311-cp311-manylinux_2_28_x86_64", "py39-none-any"])
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
FILES = st.lists(st.tuples(VERSIONS, TAGS, HEX), min_size=1, max_size=12, unique_by=lambda t: t[:2])


def _filename(version: str, tags: str) -> str:
    return f"demo-{version}-{tags}.whl"


@PROPERTIES
@given(files=FILES, fmt=st.sampled_from(["json", "html"]))
def test_every_file_of_a_page_is_kept_with_its_hash(
    files: list[tuple[str, str, str]], fmt: str
) -> None:
    if fmt == "json":
        doc = {
            "meta": {"api-version": "1.1"},
            "name": "demo",
            "files": [
                {
                    "filename": _filename(v, t),
                    "url": f"../../f/{_filename(v, t)}",
                    "hashes": {"sha256": h},
                }
                for v, t, h in files
            ],
        }
        body, ctype = json.dumps(doc).encode(), JSON_TYPE
    else:
        links = "".join(
            f'<a href="../../f/{html.escape(_filename(v, t))}#sha256={h}">x</a>'
            for v, t, h in files
        )
        body = f"<html><body><h1>Links for demo</h1>{links}</body></html>".encode()
        ctype = "text/html"
    page = parse_project_page(body, content_type=ctype, page_url=PAGE_URL, project="demo")
    assert [(f.filename, f.sha256) for f in page.files] == [
        (_filename(v, t), h) for v, t, h in files
    ]


JSON_ODDITIES = st.one_of(
    st.just(float("nan")),
    st.just(float("inf")),
    st.integers(min_value=10**30, max_value=10**40),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.booleans().filter(bool),
)


@PROPERTIES
@given(
    key=st.sampled_from(["filename", "url", "hashes", "requires-python", "yanked", "size"]),
    value=JSON_ODDITIES,
)
def test_a_file_entry_of_the_wrong_type_is_refused_never_dropped(key: str, value: object) -> None:
    entry: dict[str, object] = {
        "filename": "demo-1.0-py3-none-any.whl",
        "url": "../f/x.whl",
        "hashes": {},
    }
    entry[key] = value
    doc = {"meta": {"api-version": "1.1"}, "name": "demo", "files": [entry]}
    body = json.dumps(doc).encode()  # NaN and Infinity as Python writes them
    try:
        page = parse_project_page(body, content_type=JSON_TYPE, page_url=PAGE_URL, project="demo")
    except IndexError_ as e:
        assert PAGE_URL in str(e)
    else:
        assert len(page.files) == 1, "a file entry was dropped"


def _archive(members: dict[str, bytes], compression: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _remote(data: bytes) -> RangeFile:
    remote = RangeFile(len(data), lambda start, end: data[start : end + 1], block_size=512)
    remote.preload(0, data)
    return remote


NAMES = st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.(py|json|txt)", fullmatch=True)
MEMBERS = st.dictionaries(NAMES, st.binary(max_size=2000), min_size=1, max_size=6)


@PROPERTIES
@given(members=MEMBERS, compression=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
def test_a_member_written_is_read_back_byte_identical(
    members: dict[str, bytes], compression: int
) -> None:
    data = _archive(members, compression)
    for name, content in members.items():
        assert read_by_directory(_remote(data), name) == content


@PROPERTIES
@given(
    members=MEMBERS,
    compression=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
    where=st.floats(0, 1, exclude_max=True),
    flip=st.integers(1, 255),
)
def test_a_flipped_byte_is_never_returned_as_the_member(
    members: dict[str, bytes], compression: int, where: float, flip: int
) -> None:
    data = bytearray(_archive(members, compression))
    position = int(where * len(data))
    data[position] ^= flip
    tampered = bytes(data)
    for name, content in members.items():
        try:
            got = read_by_directory(_remote(tampered), name)
        except (_zipentry.NotHandled, _zipentry.TooLarge, IndexError_):
            continue  # refused, or left to zipfile, which checks the CRC itself
        assert got in (content, None), f"{name!r} came back changed"


@PROPERTIES
@given(size=st.integers(2**20 + 1, 8 * 2**20), byte=st.binary(min_size=1, max_size=1))
def test_a_member_inflating_past_the_bound_is_refused(size: int, byte: bytes) -> None:
    data = _archive({"x/cpp_lib.json": byte * size}, zipfile.ZIP_DEFLATED)
    remote = _remote(data)
    entry = _zipentry.find_entry(data, "x/cpp_lib.json")
    assert entry is not None
    with pytest.raises(_zipentry.TooLarge):
        _zipentry.extract(entry, remote.read_at, max_size=2**20)
    lying = type(entry)(**{**entry.__dict__, "file_size": 10})  # a record that lies
    with pytest.raises((_zipentry.TooLarge, _zipentry.NotHandled)):
        _zipentry.extract(lying, remote.read_at, max_size=2**20)
    assert len(zlib.compress(byte * size)) < size


@PROPERTIES
@given(junk=st.binary(min_size=1, max_size=40).filter(lambda b: not _is_utf8(b)))
def test_metadata_that_is_not_utf8_is_refused_naming_the_source(junk: bytes) -> None:
    data = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nSummary: " + junk + b"\n\n"
    with pytest.raises(IndexError_, match=r"^SOURCE: METADATA is not UTF-8"):
        check_metadata(data, "demo-1.0-py3-none-any.whl", "SOURCE")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
