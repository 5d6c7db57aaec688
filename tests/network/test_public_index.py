"""The index layer against the real public index (the default from pip's configuration).

The mirror reachable here strips ``core-metadata`` from JSON pages and its
``<url>.metadata`` resources 404, so these reads go through HTTP ranges.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from envbuilder.errors import IndexError_
from envbuilder.index.http import HttpClient
from envbuilder.index.pipconfig import ca_bundle, default_index_url
from envbuilder.index.remotewheel import read_core_metadata, read_member
from envbuilder.index.simple import DistributionFile, ProjectPage, fetch_project_page

XFORMERS_WHEEL = "xformers-0.0.28.post1-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_PREFIX = "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpClient]:
    with HttpClient(cache_dir=tmp_path_factory.mktemp("cache"), ca_bundle=ca_bundle()) as c:
        yield c


@pytest.fixture(scope="module")
def index_url() -> str:
    return default_index_url()


def _page(client: HttpClient, index_url: str, project: str) -> ProjectPage:
    try:
        return fetch_project_page(client, index_url, project)
    except IndexError_ as e:
        pytest.skip(f"the default index {index_url} is not reachable: {e}")


def _file(page: ProjectPage, filename: str) -> DistributionFile:
    matches = [f for f in page.files if f.filename == filename]
    assert matches, f"{filename} not on {page.url}"
    return matches[0]


def test_xformers_page(client: HttpClient, index_url: str) -> None:
    page = _page(client, index_url, "xformers")
    assert page.name == "xformers"
    assert "0.0.28.post1" in page.versions
    file = _file(page, XFORMERS_WHEEL)
    assert file.sha256 is not None and len(file.sha256) == 64
    assert file.size is not None and file.size > 10 * 1024 * 1024
    assert file.url.startswith("https://") and "#" not in file.url


def test_xformers_metadata_and_build_record_by_ranges(client: HttpClient, index_url: str) -> None:
    file = _file(_page(client, index_url, "xformers"), XFORMERS_WHEEL)
    assert file.size is not None
    before = client.bytes_downloaded
    metadata = read_core_metadata(client, file)
    assert "torch==2.4.1" in metadata.get_all("Requires-Dist", [])
    raw = read_member(client, file, "xformers/cpp_lib.json")
    assert raw is not None
    build = json.loads(raw)
    assert build["version"]["torch"].startswith("2.4.1")
    assert 1200 <= build["version"]["cuda"] < 1300
    fetched = client.bytes_downloaded - before
    assert fetched < file.size / 100, f"{fetched} bytes of a {file.size}-byte wheel"


def test_torch_metadata_pins_the_cuda_runtime(client: HttpClient, index_url: str) -> None:
    page = _page(client, index_url, "torch")
    file = _file(page, TORCH_PREFIX)
    assert file.size is not None
    before = client.bytes_downloaded
    metadata = read_core_metadata(client, file)
    pins = {
        (str(canonicalize_name(r.name)), str(r.specifier))
        for r in map(Requirement, metadata.get_all("Requires-Dist", []))
    }
    assert ("nvidia-cuda-runtime-cu12", "==12.1.105") in pins, pins
    fetched = client.bytes_downloaded - before
    assert fetched < file.size / 100, f"{fetched} bytes of a {file.size}-byte wheel"


def test_warm_rerun_reads_metadata_from_the_cache(
    client: HttpClient, index_url: str, tmp_path: Path
) -> None:
    file = _file(_page(client, index_url, "xformers"), XFORMERS_WHEEL)
    read_core_metadata(client, file)
    offline = HttpClient(cache_dir=client.cache_dir, offline=True)
    assert "torch==2.4.1" in read_core_metadata(offline, file).get_all("Requires-Dist", [])
    assert offline.requests_made == 0
