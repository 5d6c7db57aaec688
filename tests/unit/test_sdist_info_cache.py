"""What an sdist declares is read once: a re-run takes it from the cache by the sdist's sha256."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from collections.abc import Iterator
from typing import Any, cast

import pytest

from envbuilder.index.http import HttpClient
from envbuilder.index.simple import DistributionFile
from envbuilder.resolve.evidence import _sdist_info
from envbuilder.resolve.sdists import SdistInfo, read_sdist_info

PYPROJECT = b'[build-system]\nrequires = ["setuptools>=64", "torch"]\nbuild-backend = "x.y"\n'


def _sdist(*more: tuple[str, bytes]) -> bytes:
    """xformers 0.0.35's declarations, then *more* members (name, bytes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in (
            ("PKG-INFO", b"Metadata-Version: 2.1\nName: xformers\nRequires-Dist: numpy\n"),
            ("pyproject.toml", PYPROJECT),
            *more,
        ):
            member = tarfile.TarInfo(f"xformers-0.0.35/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


class _Client:
    """The two parts of `HttpClient` that `_sdist_info` uses: streams and the blob store."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.streamed = 0
        self.blobs: dict[str, bytes] = {}

    def stream(self, url: str, **_: Any) -> Iterator[bytes]:
        self.streamed += 1
        yield self.body

    def cache_get(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    def cache_put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data


EXPECTED = SdistInfo(
    requires_dist=("numpy",), build_requires=("setuptools>=64", "torch"), build_backend="x.y"
)


def _file(body: bytes, *, hashed: bool = True) -> DistributionFile:
    hashes = {"sha256": hashlib.sha256(body).hexdigest()} if hashed else {}
    return DistributionFile(
        filename="xformers-0.0.35.tar.gz", url="https://index.invalid/x.tar.gz", hashes=hashes
    )


def test_a_second_read_downloads_nothing() -> None:
    client = _Client(_sdist())
    http = cast(HttpClient, client)
    assert _sdist_info(http, _file(client.body)) == EXPECTED
    assert _sdist_info(http, _file(client.body)) == EXPECTED
    assert client.streamed == 1


@pytest.mark.parametrize(
    "kept",
    [
        b"not json",
        b'{"requires_dist": "numpy", "build_requires": [], "build_backend": null}',
        b'{"requires_dist": [], "build_requires": [1], "build_backend": null}',
        b'{"requires_dist": [], "build_requires": [], "build_backend": 3}',
        b'{"requires_dist": []}',
        b"[" * 100_000,
    ],
    ids=["not-json", "a-string-list", "a-number-requirement", "a-number-backend", "keys-missing", "deep"],
)  # fmt: skip
def test_a_kept_entry_unfit_to_use_is_read_again(kept: bytes) -> None:
    client = _Client(_sdist())
    file = _file(client.body)
    client.blobs[f"sdist-info\0sha256:{file.hashes['sha256']}"] = kept
    assert _sdist_info(cast(HttpClient, client), file) == EXPECTED
    assert client.streamed == 1


def test_an_sdist_without_a_hash_is_not_kept() -> None:
    client = _Client(_sdist())
    http = cast(HttpClient, client)
    _sdist_info(http, _file(client.body, hashed=False))
    _sdist_info(http, _file(client.body, hashed=False))
    assert client.streamed == 2 and client.blobs == {}


def test_a_tar_sdist_is_read_only_as_far_as_its_declarations() -> None:
    """PKG-INFO and pyproject.toml come first in an sdist (4th and 6th of xformers 0.0.35's
    2,429 members): the rest is neither decompressed nor checksummed. Proved with an
    archive whose tail is cut off: read to its end, it would be an error."""
    whole = _sdist(("csrc/big.bin", random.Random(0).randbytes(1 << 20)))
    cut = whole[: len(whole) // 2]
    info = read_sdist_info(cut, "xformers-0.0.35.tar.gz")
    assert info.requires_dist == ("numpy",)
    assert info.build_requires == ("setuptools>=64", "torch")
    with pytest.raises(ValueError, match="not a readable sdist archive"):
        read_sdist_info(cut[:200], "xformers-0.0.35.tar.gz")
