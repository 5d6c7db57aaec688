"""Reading one member of a wheel from its one central-directory record, as zipfile would."""

from __future__ import annotations

import io
import random
import struct
import warnings
import zipfile
from collections.abc import Callable, Sequence

import pytest

from envbuilder.index import _zipentry
from envbuilder.index.remotewheel import RangeFile, read_by_directory

METADATA = "demo-1.0.dist-info/METADATA"
RECORD_MEMBER = "xformers/cpp_lib.json"
NOISE = random.Random(0).randbytes(20_000)  # incompressible: stored or deflated, the size stays

Member = tuple[str, bytes, int]  # name, data, compression


def _archive(members: Sequence[Member], *, comment: bytes = b"", prefix: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    buffer.write(prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # duplicate names, on purpose
        with zipfile.ZipFile(buffer, "a" if prefix else "w") as archive:
            for name, data, compression in members:
                archive.writestr(name, data, compress_type=compression)
            archive.comment = comment
    return buffer.getvalue()


def _deflated(name: str, data: bytes) -> Member:
    return (name, data, zipfile.ZIP_DEFLATED)


def _stored(name: str, data: bytes) -> Member:
    return (name, data, zipfile.ZIP_STORED)


def _pad(n: int) -> list[Member]:
    return [_stored(f"pkg/module_{i:04d}.py", NOISE[i : i + 40]) for i in range(n)]


def _zipfile_read(data: bytes, name: str) -> bytes | None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return archive.read(name) if name in archive.namelist() else None


def _remote(data: bytes, tail: int, block: int = 1024) -> tuple[RangeFile, list[tuple[int, int]]]:
    fetched: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        fetched.append((start, end))
        return data[start : end + 1]

    remote = RangeFile(len(data), fetch, block_size=block)
    last = data[-tail:]
    remote.preload(len(data) - len(last), last)
    return remote, fetched


def _read(data: bytes, name: str, *, tail: int) -> tuple[bytes | None, int]:
    """What read_by_directory returns, and how many requests it made after the tail."""
    remote, fetched = _remote(data, tail)
    return read_by_directory(remote, name), len(fetched)


# -- the same bytes as zipfile, in as few requests as the layout allows --------------------------

DIST_INFO_LAST = [*_pad(300), _deflated(RECORD_MEMBER, b'{"version": {}}'), _deflated(METADATA, b"Name: demo\n" * 50)]  # fmt: skip
DIST_INFO_FIRST = [_deflated(METADATA, b"Name: demo\n" * 50), *_pad(300)]


@pytest.mark.parametrize(
    ("members", "name", "tail", "requests"),
    [
        pytest.param(DIST_INFO_LAST, METADATA, 8192, 1, id="record-in-the-tail:-one-request-for-the-member"),
        pytest.param(DIST_INFO_LAST, RECORD_MEMBER, 8192, 1, id="another-member-in-the-tail"),
        pytest.param(DIST_INFO_FIRST, METADATA, 8192, 2, id="record-before-the-tail:-the-directory-then-the-member"),
        pytest.param([_stored(METADATA, NOISE[:3000]), *_pad(5)], METADATA, 64 * 1024, 0, id="small-wheel-read-whole-by-the-tail"),
        pytest.param([*_pad(10), _stored(METADATA, NOISE[:5000])], METADATA, 2048, 1, id="stored"),
        pytest.param([_deflated(METADATA, b"old"), *_pad(300), _deflated(METADATA, b"new")], METADATA, 8192, 1, id="duplicate-names:-the-last-as-zipfile"),
        pytest.param([_deflated(METADATA, b"new"), *_pad(300), _deflated("other/" + METADATA, b"x")], METADATA, 8192, 2, id="a-longer-name-ending-the-same-is-not-it"),
    ],
)  # fmt: skip
def test_reads_what_zipfile_reads(
    members: list[Member], name: str, tail: int, requests: int
) -> None:
    data = _archive(members)
    assert _read(data, name, tail=tail) == (_zipfile_read(data, name), requests)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_archive(DIST_INFO_LAST, comment=b"made by hand PK"), id="archive-comment"),
        pytest.param(
            _archive(DIST_INFO_LAST, prefix=b"#!/bin/sh\n"), id="prefix-counted-in-the-offsets"
        ),
    ],
)
def test_what_surrounds_the_directory(data: bytes) -> None:
    assert _read(data, METADATA, tail=8192)[0] == _zipfile_read(data, METADATA) is not None


def test_an_absent_member_is_none_after_reading_the_whole_directory_once() -> None:
    data = _archive(DIST_INFO_LAST)
    remote, fetched = _remote(data, 8192)
    assert read_by_directory(remote, "xformers/absent.json") is None
    assert read_by_directory(remote, "xformers/absent.json") is None
    assert len(fetched) == 1


# -- what is left to zipfile ---------------------------------------------------------------------


def _patch(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def _record_at(data: bytes, name: str) -> int:
    return data.rindex(name.encode()) - _zipentry.RECORD_SIZE


def _flagged_encrypted(data: bytes) -> bytes:
    return _patch(data, _record_at(data, METADATA) + 8, struct.pack("<H", 1))


def _corrupt_crc(data: bytes) -> bytes:
    at = _record_at(data, METADATA) + 16
    return _patch(data, at, struct.pack("<L", struct.unpack("<L", data[at : at + 4])[0] ^ 1))


def _local_name_differs(data: bytes) -> bytes:
    return data.replace(METADATA.encode(), METADATA.replace("demo", "dEmo").encode(), 1)


def _nul_named_twin() -> bytes:
    """A later record "METADATA\\0junk", which zipfile reads as METADATA."""
    data = _archive([*DIST_INFO_LAST, _deflated(METADATA + "Xjunk", b"twin")])
    return data.replace(b"METADATAXjunk", b"METADATA\0junk")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        pytest.param(lambda: b"#!/bin/sh\n" + _archive([_deflated(METADATA, b"x" * 100)]), "bytes before the archive", id="prefixed"),
        pytest.param(lambda: _archive([(METADATA, b"x" * 100, zipfile.ZIP_BZIP2)]), "compressed with method 12", id="bzip2"),
        pytest.param(lambda: _flagged_encrypted(_archive(DIST_INFO_LAST)), "encrypted", id="encrypted"),
        pytest.param(lambda: _corrupt_crc(_archive(DIST_INFO_LAST)), "CRC-32", id="bad-crc"),
        pytest.param(lambda: _local_name_differs(_archive(DIST_INFO_LAST)), "names another file", id="local-header-disagrees"),
        pytest.param(_nul_named_twin, "NUL", id="nul-named-twin"),
    ],
)  # fmt: skip
def test_what_it_does_not_handle_is_left_to_zipfile(make: Callable[[], bytes], why: str) -> None:
    data = make()
    remote, _ = _remote(data, len(data))
    with pytest.raises(_zipentry.NotHandled, match=why):
        read_by_directory(remote, METADATA)


def test_a_zip64_end_record_is_left_to_zipfile() -> None:
    data = _archive(DIST_INFO_LAST)
    end = data.rindex(_zipentry.END_SIGNATURE)
    locator = _zipentry.LOCATOR64_SIGNATURE + bytes(16)
    with pytest.raises(_zipentry.NotHandled, match="zip64"):
        _zipentry.find_directory(locator + data[end:], end - len(locator), len(data))


def test_no_end_record_in_the_tail_is_none() -> None:
    data = _archive(DIST_INFO_LAST)
    assert _zipentry.find_directory(data[:1000], 0, len(data)) is None


@pytest.mark.parametrize(
    ("size", "held", "start"),
    [
        pytest.param(100, [], 100, id="nothing-held"),
        pytest.param(100, [9], 90, id="the-last-short-block"),
        pytest.param(100, [6, 7, 8, 9], 60, id="a-run-to-the-end"),
        pytest.param(100, [2, 8, 9], 80, id="a-gap-stops-it"),
        pytest.param(100, [5], 100, id="the-last-block-missing"),
        pytest.param(100, list(range(10)), 0, id="all"),
    ],
)
def test_cached_suffix_start(size: int, held: list[int], start: int) -> None:
    blocks = {i: b"." * 10 for i in held}
    remote = RangeFile(
        size, lambda a, b: pytest.fail("no fetch expected"), block_size=10, blocks=blocks
    )
    assert remote.cached_suffix_start() == start
    assert remote.read_at(start, size + 50) == b"." * (size - start)
