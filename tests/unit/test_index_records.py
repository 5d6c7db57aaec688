"""What the index's records say, or an error naming what is wrong with them: a
``Requires-Dist`` line that is no requirement, a build record of the wrong types, a
PEP 691 page of another major API version. None is dropped or read as "unknown"."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from envbuilder.errors import IndexError_
from envbuilder.index.http import HttpClient
from envbuilder.index.remotewheel import read_core_metadata, read_member
from envbuilder.index.simple import DistributionFile, parse_json_page

FILENAME = "xformers-0.0.28.post1-cp311-cp311-manylinux_2_28_x86_64.whl"
RECORD = "xformers/cpp_lib.json"


def _wheel(
    tmp_path: Path, *, requires: tuple[str, ...] = (), record: bytes | None = None
) -> DistributionFile:
    path = tmp_path / FILENAME
    metadata = "Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.28.post1\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires) + "\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("xformers/__init__.py", b"")
        archive.writestr("xformers-0.0.28.post1.dist-info/METADATA", metadata)
        if record is not None:
            archive.writestr(RECORD, record)
    return DistributionFile(filename=FILENAME, url=path.as_uri())


@pytest.fixture
def client(tmp_path: Path) -> HttpClient:
    return HttpClient(cache_dir=tmp_path / "cache")


def test_valid_requirements_are_all_kept(tmp_path: Path, client: HttpClient) -> None:
    lines = ("torch==2.4.1", 'numpy; python_version >= "3.9"')
    message = read_core_metadata(client, _wheel(tmp_path, requires=lines))
    assert message.get_all("Requires-Dist") == list(lines)


@pytest.mark.parametrize("line", ["torch ==", "torch (>=2.4", "torch; os_name ==="])
def test_a_requires_dist_line_that_is_no_requirement_is_named(
    tmp_path: Path, client: HttpClient, line: str
) -> None:
    wheel = _wheel(tmp_path, requires=("numpy", line))
    with pytest.raises(IndexError_, match=re.escape(f"Requires-Dist {line!r}")):
        read_core_metadata(client, wheel)


GOOD = {"version": {"torch": "2.4.1+cu121", "cuda": 1201}, "env": {"TORCH_CUDA_ARCH_LIST": "8.0"}}


@pytest.mark.parametrize(
    "record",
    [
        GOOD,
        {"version": {"torch": "2.4.1", "cuda": "12.1"}, "env": {}},
        {"version": {"torch": "2.4.1+cpu", "cuda": None}},
        {"version": {}, "extra": [1, 2]},
    ],
)
def test_a_well_typed_build_record_is_read(
    tmp_path: Path, client: HttpClient, record: object
) -> None:
    data = json.dumps(record).encode()
    assert read_member(client, _wheel(tmp_path, record=data), RECORD) == data


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ([1, 2], "the document is a list, not an object"),
        ({"version": "2.4.1"}, "'version' is a str, not an object"),
        (
            {"version": {"torch": 2.4, "cuda": 1201}},
            "'version.torch' is a float (2.4), not a string",
        ),
        ({"version": {"torch": "2.4.1", "cuda": [12, 1]}}, "'version.cuda' is a list"),
        ({"version": {"torch": "2.4.1", "cuda": True}}, "'version.cuda' is a bool"),
        ({"env": ["TORCH_CUDA_ARCH_LIST"]}, "'env' is a list, not an object"),
        ({"env": {"TORCH_CUDA_ARCH_LIST": 8.0}}, "'env.TORCH_CUDA_ARCH_LIST' is a float"),
    ],
)
def test_a_wrong_typed_build_record_is_called_malformed(
    tmp_path: Path, client: HttpClient, record: object, problem: str
) -> None:
    wheel = _wheel(tmp_path, record=json.dumps(record).encode())
    with pytest.raises(IndexError_, match="malformed") as raised:
        read_member(client, wheel, RECORD)
    assert FILENAME in str(raised.value) and problem in str(raised.value)


def _page(version: object) -> bytes:
    return json.dumps({"meta": {"api-version": version}, "name": "xformers", "files": []}).encode()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.4", "1"])
def test_api_version_1_is_read(version: str) -> None:
    page = parse_json_page(_page(version), page_url="https://i.example/simple/x/", project="x")
    assert page.files == ()


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("2.0", "major version 2"),
        ("0.9", "major version 0"),
        ("one", "not a version"),
        ("", "not a version"),
    ],
)
def test_another_major_api_version_is_refused(version: str, problem: str) -> None:
    with pytest.raises(IndexError_, match=problem) as raised:
        parse_json_page(_page(version), page_url="https://i.example/simple/x/", project="x")
    assert "api-version" in str(raised.value) and "1.x" in str(raised.value)
