"""Simple API documents (PEP 691 JSON, PEP 503 HTML) into `DistributionFile` records."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from envbuilder.errors import IndexError_
from envbuilder.index.remotewheel import RangeFile, metadata_member_name
from envbuilder.index.simple import (
    DistributionFile,
    is_local,
    list_local_directory,
    parse_html_page,
    parse_json_page,
    parse_project_page,
    project_url,
)

PAGE = "https://index.example/simple/xformers/"
SHA = "ab" * 32
WHL = "xformers-0.0.28.post1-cp311-cp311-manylinux_2_28_x86_64.whl"


def _json(**entry: Any) -> bytes:
    return json.dumps(
        {"meta": {"api-version": "1.1"}, "name": "xformers", "files": [entry]}
    ).encode()


def _html(attrs: str, text: str = WHL) -> str:
    return f"<html><body><a {attrs}>{text}</a></body></html>"


BASE = {"filename": WHL, "url": f"https://files.example/x/{WHL}", "hashes": {"sha256": SHA}}

JSON_CASES: list[tuple[str, bytes, dict[str, Any]]] = [
    ("plain", _json(**BASE), {"url": f"https://files.example/x/{WHL}", "hashes": {"sha256": SHA}}),
    (
        "relative url",
        _json(**{**BASE, "url": f"../../files/{WHL}"}),
        {"url": f"https://index.example/files/{WHL}"},
    ),
    (
        "fragment stripped",
        _json(**{**BASE, "url": f"/f/{WHL}#sha256={SHA}"}),
        {"url": f"https://index.example/f/{WHL}"},
    ),
    (
        "requires-python",
        _json(**BASE, **{"requires-python": ">=3.9"}),
        {"requires_python": ">=3.9"},
    ),
    ("yanked bool", _json(**BASE, yanked=True), {"yanked": True, "yanked_reason": None}),
    (
        "yanked reason",
        _json(**BASE, yanked="bad build"),
        {"yanked": True, "yanked_reason": "bad build"},
    ),
    ("not yanked", _json(**BASE, yanked=False), {"yanked": False}),
    (
        "core-metadata hash",
        _json(**BASE, **{"core-metadata": {"sha256": SHA}}),
        {"core_metadata": {"sha256": SHA}},
    ),
    ("core-metadata true", _json(**BASE, **{"core-metadata": True}), {"core_metadata": True}),
    (
        "old dist-info-metadata",
        _json(**BASE, **{"dist-info-metadata": {"sha256": SHA}}),
        {"core_metadata": {"sha256": SHA}},
    ),
    ("stripped by a mirror", _json(**BASE), {"core_metadata": False}),
    (
        "size and upload time",
        _json(**BASE, size=123, **{"upload-time": "2024-09-13T18:56:23Z"}),
        {"size": 123, "upload_time": "2024-09-13T18:56:23Z"},
    ),
]


@pytest.mark.parametrize(
    ("document", "expected"), [c[1:] for c in JSON_CASES], ids=[c[0] for c in JSON_CASES]
)
def test_json_page(document: bytes, expected: dict[str, Any]) -> None:
    page = parse_json_page(document, page_url=PAGE, project="XFormers")
    assert page.name == "xformers"
    (file,) = page.files
    assert file.filename == WHL
    for field, value in expected.items():
        assert getattr(file, field) == value, field


HTML_CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "hash fragment",
        _html(f'href="https://files.example/{WHL}#sha256={SHA}"'),
        {"url": f"https://files.example/{WHL}", "hashes": {"sha256": SHA}},
    ),
    (
        "relative href",
        _html(f'href="../../packages/{WHL}"'),
        {"url": f"https://index.example/packages/{WHL}", "hashes": {}},
    ),
    (
        "base href",
        f'<html><head><base href="https://cdn.example/a/"></head><body><a href="{WHL}">{WHL}</a></body></html>',
        {"url": f"https://cdn.example/a/{WHL}"},
    ),
    (
        "requires-python unescaped",
        _html(f'href="/{WHL}" data-requires-python="&gt;=3.9,&lt;4"'),
        {"requires_python": ">=3.9,<4"},
    ),
    (
        "yanked without reason",
        _html(f'href="/{WHL}" data-yanked'),
        {"yanked": True, "yanked_reason": None},
    ),
    (
        "yanked with reason",
        _html(f'href="/{WHL}" data-yanked="broken &amp; removed"'),
        {"yanked": True, "yanked_reason": "broken & removed"},
    ),
    (
        "core-metadata hash",
        _html(f'href="/{WHL}" data-core-metadata="sha256={SHA}"'),
        {"core_metadata": {"sha256": SHA}},
    ),
    (
        "core-metadata true",
        _html(f'href="/{WHL}" data-core-metadata="true"'),
        {"core_metadata": True},
    ),
    (
        "old dist-info-metadata",
        _html(f'href="/{WHL}" data-dist-info-metadata="sha256={SHA}"'),
        {"core_metadata": {"sha256": SHA}},
    ),
    (
        "no metadata",
        _html(f'href="/{WHL}"'),
        {"core_metadata": False, "yanked": False, "requires_python": None},
    ),
]


@pytest.mark.parametrize(
    ("document", "expected"), [c[1:] for c in HTML_CASES], ids=[c[0] for c in HTML_CASES]
)
def test_html_page(document: str, expected: dict[str, Any]) -> None:
    (file,) = parse_html_page(document, page_url=PAGE).files
    assert file.filename == WHL
    for field, value in expected.items():
        assert getattr(file, field) == value, field


def test_pytorch_style_html_with_local_version() -> None:
    name = "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"
    document = _html(
        f'href="/whl/cu121/torch-2.5.1%2Bcu121-cp311-cp311-linux_x86_64.whl#sha256={SHA}"', name
    )
    (file,) = parse_html_page(document, page_url="https://torch.example/whl/cu121/torch/").files
    assert file.filename == name
    assert (
        file.url
        == "https://torch.example/whl/cu121/torch-2.5.1%2Bcu121-cp311-cp311-linux_x86_64.whl"
    )
    assert (file.project, str(file.version)) == ("torch", "2.5.1+cu121")


def test_flat_find_links_page_keeps_only_the_project() -> None:
    document = "".join(
        f'<a href="{n}">{n}</a>'
        for n in (
            "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            "numpy-2.1.0-py3-none-any.whl",
            "torch-2.12.0.tar.gz",
            "README.txt",
        )
    )
    page = parse_html_page(document, page_url="https://links.example/wheels/", project="Torch")
    assert [f.filename for f in page.files] == [
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.12.0.tar.gz",
    ]
    assert page.versions == ("2.12.0", "2.13.0")


@pytest.mark.parametrize(
    ("content_type", "document", "expected_url"),
    [
        ("application/vnd.pypi.simple.v1+json", _json(**BASE), BASE["url"]),
        (
            "application/vnd.pypi.simple.v1+html",
            _html(f'href="/{WHL}"').encode(),
            f"https://index.example/{WHL}",
        ),
        (
            "text/html; charset=utf-8",
            _html(f'href="/{WHL}"').encode(),
            f"https://index.example/{WHL}",
        ),
    ],
)
def test_format_follows_content_type(content_type: str, document: bytes, expected_url: str) -> None:
    page = parse_project_page(
        document, content_type=content_type, page_url=PAGE, project="xformers"
    )
    assert page.name == "xformers"
    assert [f.url for f in page.files] == [expected_url]


@pytest.mark.parametrize(
    ("content_type", "document", "message"),
    [
        ("application/json", b"{}", "unsupported Content-Type 'application/json'"),
        ("application/vnd.pypi.simple.v1+json", b"{not json", "not a valid PEP 691 JSON page"),
        ("application/vnd.pypi.simple.v1+json", b'{"name": "x"}', "without a 'files' list"),
    ],
)
def test_bad_pages_are_clear_errors(content_type: str, document: bytes, message: str) -> None:
    with pytest.raises(IndexError_, match=message) as info:
        parse_project_page(document, content_type=content_type, page_url=PAGE, project="xformers")
    assert PAGE in str(info.value)


@pytest.mark.parametrize(
    ("index", "project", "expected"),
    [
        ("https://i.example/simple", "Flash_Attn", "https://i.example/simple/flash-attn/"),
        ("https://i.example/simple/", "xformers", "https://i.example/simple/xformers/"),
    ],
)
def test_project_url_normalises(index: str, project: str, expected: str) -> None:
    assert project_url(index, project) == expected


@pytest.mark.parametrize(
    ("location", "local"),
    [
        ("file:///srv/wheels", True),
        ("/srv/wheels", True),
        ("wheels", True),
        ("https://i.example/simple", False),
        ("HTTP://i.example", False),
    ],
)
def test_is_local(location: str, local: bool) -> None:
    assert is_local(location) is local


def test_local_directory_lists_wheels_with_their_sha256(tmp_path: Path) -> None:
    wanted = tmp_path / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wanted.write_bytes(b"not really a zip, only hashed")
    (tmp_path / "numpy-2.1.0-py3-none-any.whl").write_bytes(b"other")
    (tmp_path / "notes.txt").write_text("ignored")
    page = list_local_directory(tmp_path, "torch")
    assert page.files == (
        DistributionFile(
            filename=wanted.name,
            url=wanted.resolve().as_uri(),
            hashes={"sha256": hashlib.sha256(wanted.read_bytes()).hexdigest()},
            size=wanted.stat().st_size,
        ),
    )


@pytest.mark.parametrize(
    ("filename", "member"),
    [
        (WHL, "xformers-0.0.28.post1.dist-info/METADATA"),
        ("torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl", "torch-2.5.1+cu121.dist-info/METADATA"),
        ("flash_attn-2.6.3-1-py3-none-any.whl", "flash_attn-2.6.3.dist-info/METADATA"),
    ],
)
def test_metadata_member_name(filename: str, member: str) -> None:
    assert metadata_member_name(filename) == member


@pytest.mark.parametrize("block_size", [7, 64, 4096])
def test_range_file_reads_a_zip_fetching_only_missing_blocks(block_size: int) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pad.bin", bytes(range(256)) * 40, compress_type=zipfile.ZIP_STORED)
        archive.writestr("a.dist-info/METADATA", b"Name: a\n")
    data = buffer.getvalue()
    fetched: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        fetched.append((start, end))
        return data[start : end + 1]

    remote = RangeFile(len(data), fetch, block_size=block_size)
    remote.preload(len(data) - 100, data[-100:])
    with zipfile.ZipFile(remote) as archive:
        assert archive.read("a.dist-info/METADATA") == b"Name: a\n"
    spans = sorted(fetched)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), "a byte was fetched twice"
    assert sum(end - start + 1 for start, end in fetched) < len(data) - 256 * 40 + 2 * block_size


@pytest.mark.parametrize("markup", ["<![DOCTYPE html><html></html>", "<![\x00DOCTYPE html>"])
def test_markup_the_html_parser_asserts_on_is_an_index_error(markup: str) -> None:
    """html.parser raises AssertionError on `<![` sections it does not know (found by the
    generated-input tests); a page is then an index error naming it, never a crash."""
    with pytest.raises(IndexError_, match=r"https://x\.invalid/simple/t/"):
        parse_html_page(markup.encode(), page_url="https://x.invalid/simple/t/")
