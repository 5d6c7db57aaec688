"""The index layer against a real HTTP server on loopback, serving real wheels."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from pathlib import Path

import pytest

from envbuilder.errors import IndexError_
from envbuilder.index.remotewheel import read_core_metadata, read_member
from envbuilder.index.simple import DistributionFile, fetch_project_page
from tests.integration.conftest import ClientFactory, ServerFactory, WheelFactory
from tests.support.index_server import IndexedFile, IndexServer
from tests.support.wheels import BuiltWheel, cpp_lib_json

XF_TAGS = "cp311-cp311-manylinux_2_28_x86_64"
MB = 1024 * 1024


@pytest.fixture
def xformers_wheel(wheel_factory: WheelFactory) -> BuiltWheel:
    return wheel_factory(
        "xformers",
        "0.0.28.post1",
        tags=XF_TAGS,
        requires_dist=["numpy", "torch==2.4.1"],
        requires_python=">=3.9",
        members={
            "xformers/cpp_lib.json": cpp_lib_json(
                torch="2.4.1+cu121", cuda=1201, arch_list="8.0 9.0a"
            )
        },
        padding=20 * MB,
    )


def _only(files: tuple[DistributionFile, ...]) -> DistributionFile:
    assert len(files) == 1, files
    return files[0]


def _wheel_requests(server: IndexServer, filename: str) -> list[str]:
    return [p for p in server.stats.paths() if p.endswith(filename.replace("+", "%2B"))]


@pytest.mark.parametrize("fmt", ["json", "html", "auto"])
def test_page_in_either_format_gives_the_same_records(
    fmt: str, wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    good = wheel_factory("Flash_Attn", "2.6.3", requires_python=">=3.8")
    bad = wheel_factory("flash-attn", "2.6.2", tags="cp311-cp311-linux_x86_64")
    server = index_server(
        {"flash-attn": [IndexedFile(wheel=good), IndexedFile(wheel=bad, yanked="broken build")]},
        format=fmt,
    )
    page = fetch_project_page(http_client(), server.index_url("simple"), "Flash.Attn")
    assert page.name == "flash-attn"
    assert [f.filename for f in page.files] == [good.filename, bad.filename]
    first, second = page.files
    assert first.url == server.file_url("simple", good.filename)
    assert first.hashes == {"sha256": good.sha256}
    assert first.requires_python == ">=3.8"
    assert (first.yanked, first.yanked_reason) == (False, None)
    assert (second.yanked, second.yanked_reason) == (True, "broken build")
    assert first.core_metadata == {"sha256": hashlib.sha256(good.metadata).hexdigest()}
    assert page.versions == ("2.6.2", "2.6.3")
    accept = server.stats.log[-1].headers["accept"]
    assert accept.startswith("application/vnd.pypi.simple.v1+json")


def test_missing_project_is_an_empty_page(
    index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({})
    page = fetch_project_page(http_client(), server.index_url("simple"), "no-such-thing")
    assert (page.name, page.files) == ("no-such-thing", ())


@pytest.mark.parametrize(
    ("advertise", "serve", "expect_metadata_file", "expect_ranges"),
    [
        (True, True, True, False),  # PEP 658: one small file, the wheel untouched
        (True, False, True, True),  # advertised but 404 (a real mirror does this): ranges
        (False, False, False, True),  # not advertised: straight to ranges
    ],
)
def test_core_metadata_source(
    advertise: bool,
    serve: bool,
    expect_metadata_file: bool,
    expect_ranges: bool,
    xformers_wheel: BuiltWheel,
    index_server: ServerFactory,
    http_client: ClientFactory,
) -> None:
    server = index_server(
        {"xformers": [xformers_wheel]}, advertise_metadata=advertise, serve_metadata=serve
    )
    client = http_client()
    file = _only(fetch_project_page(client, server.index_url("simple"), "xformers").files)
    before = client.bytes_downloaded
    message = read_core_metadata(client, file)
    assert message.get_all("Requires-Dist") == ["numpy", "torch==2.4.1"]
    assert message["Requires-Python"] == ">=3.9"
    paths = server.stats.paths()
    assert any(p.endswith(".metadata") for p in paths) is expect_metadata_file
    assert bool(_wheel_requests(server, xformers_wheel.filename)) is expect_ranges
    fetched = client.bytes_downloaded - before
    assert fetched < xformers_wheel.size / 100, (fetched, xformers_wheel.size)


def test_member_by_ranges_reads_a_tiny_fraction_of_a_large_wheel(
    xformers_wheel: BuiltWheel, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"xformers": [xformers_wheel]}, advertise_metadata=False)
    client = http_client()
    file = _only(fetch_project_page(client, server.index_url("simple"), "xformers").files)
    server.stats.reset()
    before = client.bytes_downloaded
    data = read_member(client, file, "xformers/cpp_lib.json")
    assert data is not None
    assert json.loads(data)["version"] == {
        "cuda": 1201,
        "hip": None,
        "torch": "2.4.1+cu121",
        "python": "3.11.10",
    }
    assert read_member(client, file, "xformers/not_there.json") is None
    assert client.bytes_downloaded - before == server.stats.bytes_sent
    assert server.stats.bytes_sent < xformers_wheel.size / 100
    assert all(r.status == 206 for r in server.stats.log)


def test_pytorch_style_per_cuda_layout(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    torch = wheel_factory(
        "torch",
        "2.5.1+cu121",
        tags="cp311-cp311-linux_x86_64",
        requires_dist=["filelock"],
        padding=2 * MB,
    )
    server = index_server(
        {"torch": [torch]},
        prefix="whl/cu121",
        format="html",
        advertise_metadata=False,
        serve_metadata=False,
    )
    client = http_client()
    page = fetch_project_page(client, server.index_url("whl/cu121"), "torch")
    file = _only(page.files)
    assert file.filename == "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"
    assert file.url.endswith("/whl/cu121/files/torch-2.5.1%2Bcu121-cp311-cp311-linux_x86_64.whl")
    assert str(file.version) == "2.5.1+cu121"
    message = read_core_metadata(client, file)
    assert (message["Version"], message.get_all("Requires-Dist")) == ("2.5.1+cu121", ["filelock"])


def test_server_ignoring_range_is_a_clear_error_not_a_download(
    xformers_wheel: BuiltWheel, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"xformers": [xformers_wheel]}, advertise_metadata=False, ranges=False)
    client = http_client()
    file = _only(fetch_project_page(client, server.index_url("simple"), "xformers").files)
    before = client.bytes_downloaded
    with pytest.raises(
        IndexError_, match=r"ignored the Range header \(HTTP 200 instead of 206\)"
    ) as info:
        read_core_metadata(client, file)
    assert file.url in str(info.value)
    assert client.bytes_downloaded == before


def test_wrong_advertised_metadata_hash_is_an_error(
    xformers_wheel: BuiltWheel, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"xformers": [xformers_wheel]})
    client = http_client()
    file = _only(fetch_project_page(client, server.index_url("simple"), "xformers").files)
    tampered = dataclasses.replace(file, core_metadata={"sha256": "0" * 64})
    with pytest.raises(IndexError_, match="does not match the index's"):
        read_core_metadata(client, tampered)


@pytest.mark.parametrize(("status", "retry_after"), [(503, None), (429, 0), (502, None)])
def test_transient_failures_are_retried(
    status: int,
    retry_after: int | None,
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    http_client: ClientFactory,
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]})
    server.fail_next(2, status, retry_after)
    page = fetch_project_page(http_client(retries=3), server.index_url("simple"), "six")
    assert [f.filename for f in page.files] == [six.filename]
    assert [r.status for r in server.stats.log] == [status, status, 200]


def test_timeouts_are_retried(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]})
    server.delay_next(1, 1.0)
    page = fetch_project_page(
        http_client(retries=2, timeout=0.25), server.index_url("simple"), "six"
    )
    assert [f.filename for f in page.files] == [six.filename]
    assert server.stats.arrivals == 2  # the first one timed out and was asked again


def test_exhausted_retries_name_the_url_and_status(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]})
    server.fail_next(10, 503)
    with pytest.raises(IndexError_, match=r"HTTP 503") as info:
        fetch_project_page(http_client(retries=2), server.index_url("simple"), "six")
    assert server.index_url("simple") + "/six/" in str(info.value)
    assert server.stats.requests == 3


def test_unreachable_index_is_a_clear_error(http_client: ClientFactory) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/simple"
    with pytest.raises(IndexError_, match=r"failed") as info:
        fetch_project_page(http_client(retries=1), url, "six")
    assert url in str(info.value)


def test_etag_revalidation_costs_no_body_bytes(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]}, cache_control="max-age=0")
    client = http_client()
    first = fetch_project_page(client, server.index_url("simple"), "six")
    after_first = client.bytes_downloaded
    assert after_first > 0
    second = fetch_project_page(client, server.index_url("simple"), "six")
    assert second.files == first.files
    assert [r.status for r in server.stats.log] == [200, 304]
    assert server.stats.log[1].headers.get("if-none-match") == second.etag
    assert client.bytes_downloaded == after_first
    assert client.requests_made == 2


def test_fresh_page_is_served_without_a_request(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]}, cache_control="max-age=600")
    client = http_client()
    fetch_project_page(client, server.index_url("simple"), "six")
    fetch_project_page(client, server.index_url("simple"), "six")
    assert server.stats.requests == 1
    assert client.requests_made == 1


def test_warm_and_offline_runs_need_no_network(
    xformers_wheel: BuiltWheel, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"xformers": [xformers_wheel]}, advertise_metadata=False)
    online = http_client()
    file = _only(fetch_project_page(online, server.index_url("simple"), "xformers").files)
    read_core_metadata(online, file)
    read_member(online, file, "xformers/cpp_lib.json")

    warm = http_client()
    assert read_core_metadata(warm, file)["Version"] == "0.0.28.post1"
    assert read_member(warm, file, "xformers/cpp_lib.json") is not None
    assert warm.requests_made == 0

    server.stop()
    offline = http_client(offline=True)
    page = fetch_project_page(offline, server.index_url("simple"), "xformers")
    assert page.files == (file,)
    assert read_core_metadata(offline, file).get_all("Requires-Dist") == ["numpy", "torch==2.4.1"]
    assert (offline.requests_made, offline.bytes_downloaded) == (0, 0)
    with pytest.raises(
        IndexError_, match=r"offline: .*/simple/torch/.* is not in the cache; run once online"
    ):
        fetch_project_page(offline, server.index_url("simple"), "torch")


def test_local_directory_of_wheels(wheel_factory: WheelFactory, http_client: ClientFactory) -> None:
    torch = wheel_factory(
        "torch", "2.13.0+cpu", tags="cp311-cp311-manylinux_2_28_x86_64", requires_dist=["sympy"]
    )
    wheel_factory("numpy", "2.1.0")
    directory: Path = torch.path.parent
    client = http_client(offline=True)  # nothing here may touch the network
    for location in (str(directory), directory.as_uri()):
        page = fetch_project_page(client, location, "torch")
        file = _only(page.files)
        assert (file.filename, file.sha256, file.size) == (torch.filename, torch.sha256, torch.size)
        assert read_core_metadata(client, file).get_all("Requires-Dist") == ["sympy"]


def test_the_deciding_threads_and_the_relay_s_fetches_share_the_pool_without_discarding(
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    http_client: ClientFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A resolve's requests at once: its deciding threads (--jobs) and the relay's fetches
    for uv. A pool smaller than that discarded a connection for each extra one, with a
    warning on the user's terminal."""
    from concurrent.futures import ThreadPoolExecutor

    from envbuilder.index.http import RELAY_CONNECTIONS

    projects = {f"p{n}": [wheel_factory(f"p{n}", "1.0")] for n in range(8 + RELAY_CONNECTIONS)}
    server = index_server(projects)
    server.delay_next(len(projects), 0.3)  # all of them in flight together
    client = http_client(max_workers=8)
    with ThreadPoolExecutor(len(projects)) as pool:
        pages = list(
            pool.map(lambda p: client.get(server.index_url("simple") + f"/{p}/"), projects)
        )
    assert all(page.status == 200 for page in pages)
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
