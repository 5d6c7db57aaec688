"""The loopback relay uv reads the indexes through: each page and metadata file once per run."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from envbuilder.errors import InputError
from envbuilder.index.relay import IndexRelay, fitting
from envbuilder.index.simple import JSON_TYPE
from tests.integration.conftest import ClientFactory, ServerFactory, WheelFactory
from tests.support.index_server import IndexServer


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _get(url: str, accept: str = JSON_TYPE) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with _OPENER.open(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def numpy_index(wheel_factory: WheelFactory, index_server: ServerFactory) -> Any:
    def make(**switches: Any) -> Any:
        wheel = wheel_factory("numpy", "2.0.0", requires_dist=["packaging>=20"])
        return index_server({"numpy": [wheel]}, **switches), wheel

    return make


@pytest.mark.parametrize("advertised", [True, False], ids=["advertised", "stripped"])
def test_a_page_points_at_the_relay_and_serves_each_wheel_s_metadata(
    numpy_index: Any, http_client: ClientFactory, advertised: bool
) -> None:
    server, wheel = numpy_index(format="json", advertise_metadata=advertised)
    with IndexRelay(http_client()) as relay:
        status, headers, body = _get(relay.index_url(server.index_url("simple")) + "numpy/")
        assert status == 200 and headers["Content-Type"] == JSON_TYPE
        (entry,) = json.loads(body)["files"]
        assert entry["url"].startswith(relay.index_url("x").split("/i/")[0] + "/f/")
        assert entry["hashes"] == {"sha256": wheel.sha256}
        assert entry["core-metadata"]  # advertised by the relay where the index stripped it
        status, _, metadata = _get(entry["url"] + ".metadata", accept="*/*")
        assert status == 200
        assert b"Requires-Dist: packaging>=20" in metadata
        assert relay.restore(f'url = "{entry["url"]}"') == (
            f'url = "{server.file_url("simple", wheel.filename)}"'
        )
        status, headers, _ = _get(entry["url"], accept="*/*")  # the file itself
        assert status == 302 and headers["Location"] == server.file_url("simple", wheel.filename)


def test_each_page_and_metadata_file_is_fetched_once_however_many_ask(
    numpy_index: Any, http_client: ClientFactory
) -> None:
    server, wheel = numpy_index(format="json", advertise_metadata=False, cache_control=None)
    with IndexRelay(http_client()) as relay:
        page = relay.index_url(server.index_url("simple")) + "numpy/"
        bodies: list[bytes] = []

        def ask() -> None:
            (entry,) = json.loads(_get(page)[2])["files"]
            bodies.append(_get(entry["url"] + ".metadata", accept="*/*")[2])

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(bodies) == 8 and len(set(bodies)) == 1
    counts = Counter(server.stats.paths())
    assert counts["/simple/numpy/"] == 1
    file_path = urllib.parse.urlsplit(server.file_url("simple", wheel.filename)).path
    assert 1 <= counts[file_path] <= 3, counts  # the ranges that read METADATA, once


def test_an_html_page_is_left_to_uv_and_a_missing_project_is_a_404(
    numpy_index: Any, http_client: ClientFactory
) -> None:
    server, _ = numpy_index(format="html")
    with IndexRelay(http_client()) as relay:
        index = relay.index_url(server.index_url("simple"))
        status, headers, _ = _get(index + "numpy/")
        assert status == 302 and headers["Location"] == server.index_url("simple") + "/numpy/"
        assert _get(index + "nothing-here/")[0] == 404


def test_another_user_without_the_token_reads_nothing(
    numpy_index: Any, http_client: ClientFactory
) -> None:
    server, _ = numpy_index(format="json")
    with IndexRelay(http_client()) as relay:
        index = relay.index_url(server.index_url("simple"))
        base, _, rest = index.partition("/i/")
        guessed = base.rsplit("/", 1)[0] + "/not-the-token/i/" + rest
        assert _get(guessed + "numpy/")[0] == 404
        assert _get(index + "numpy/")[0] == 200
    assert server.stats.paths().count("/simple/numpy/") == 1


class _RefusingClient:
    """A client that refuses every URL, as `HttpClient` refuses a malformed index URL."""

    def get(self, url: str, **kwargs: Any) -> Any:
        raise InputError(f"malformed index-url {url!r}")


def test_an_error_of_envbuilder_s_own_is_a_502_not_a_dropped_connection(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """uv hears the reason; no traceback reaches the user's terminal from the relay's thread."""
    with IndexRelay(_RefusingClient()) as relay:  # type: ignore[arg-type]
        status, _, body = _get(relay.index_url("not a url") + "numpy/")
    assert status == 502 and b"malformed index-url 'not a url/numpy/'" in body
    assert "Traceback" not in capfd.readouterr().err


def test_restore_leaves_other_urls_and_unknown_numbers_alone(
    http_client: ClientFactory, tmp_path: Path
) -> None:
    with IndexRelay(http_client()) as relay:
        index = relay.index_url("https://index.invalid/simple")
        base = index.split("/i/")[0]
        text = f"{index}numpy/ {base}/f/7/x.whl https://elsewhere.invalid/a.whl"
        assert relay.restore(text) == (
            f"https://index.invalid/simple/numpy/ {base}/f/7/x.whl https://elsewhere.invalid/a.whl"
        )


def test_a_page_keeps_only_the_wheels_the_run_s_targets_accept(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    """A universal closure would list every platform's wheels; envbuilder reads and drops
    them. A release with no wheel for the targets keeps them all (uv sees the same releases)."""
    linux = "cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"
    wheels = [
        wheel_factory("numpy", "2.0.0", tags=linux),
        wheel_factory("numpy", "2.0.0", tags="cp312-cp312-win_amd64"),
        wheel_factory("numpy", "2.0.0", tags="cp312-cp312-macosx_14_0_arm64"),
        wheel_factory("numpy", "2.0.0", tags="py3-none-any", build="1"),
        wheel_factory("numpy", "2.1.0", tags="cp312-cp312-win_amd64"),
        wheel_factory("numpy", "2.1.0", tags="cp312-cp312-macosx_14_0_arm64"),
    ]
    server = index_server({"numpy": wheels}, format="json")
    served = {}
    for platforms in (None, {"manylinux_2_17_x86_64", "linux_x86_64", "any"}):
        with IndexRelay(http_client(), platforms=platforms) as relay:
            status, _, body = _get(relay.index_url(server.index_url("simple")) + "numpy/")
            assert status == 200
            served[platforms is None] = sorted(e["filename"] for e in json.loads(body)["files"])
    assert served[True] == sorted(w.filename for w in wheels)
    assert served[False] == sorted(
        [wheels[0].filename, wheels[3].filename, wheels[4].filename, wheels[5].filename]
    )


def test_fitting_leaves_sdists_and_unknown_entries_alone() -> None:
    files: list[Any] = [
        {"filename": "pkg-1.0.tar.gz"},
        {"filename": "pkg-1.0-py3-none-win_amd64.whl"},
        {"filename": "pkg-1.0-py3-none-manylinux_2_28_x86_64.whl"},
        {"filename": "not-a-wheel.whl"},
        {"url": "no-filename"},
        "junk",
    ]
    kept = fitting(files, {"manylinux_2_28_x86_64"})
    assert kept == [files[0], files[2], files[3], files[4], files[5]]


def _wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def chain_index(wheel_factory: WheelFactory, index_server: ServerFactory) -> Any:
    """numpy requires packaging<24 (and pytest only for an extra); packaging's newest is 24."""
    numpy = wheel_factory(
        "numpy", "2.0.0", requires_dist=["packaging<24", 'pytest; extra == "test"']
    )
    packaging = [wheel_factory("packaging", v) for v in ("22.0", "23.0", "24.0")]
    projects = {"numpy": [numpy], "packaging": packaging, "pytest": []}
    server = index_server(projects, format="json", advertise_metadata=True, cache_control=None)
    return server, numpy, packaging


def test_the_relay_fetches_what_uv_will_ask_next_before_it_asks(
    chain_index: Any, http_client: ClientFactory
) -> None:
    """numpy's page brings its metadata, that the page of packaging it requires, and that
    the metadata of the release the requirement allows (23.0, not 24.0); an extra's
    requirement is not followed. uv's own requests then find them fetched, once."""
    server: IndexServer = chain_index[0]
    numpy, packaging = chain_index[1:]

    def paths() -> list[str]:
        return server.stats.paths()

    def metadata_path(filename: str) -> str:
        return urllib.parse.urlsplit(server.file_url("simple", filename)).path + ".metadata"

    wanted = metadata_path(packaging[1].filename)
    with IndexRelay(http_client(), pythons={"3.12"}) as relay:
        index = relay.index_url(server.index_url("simple"))
        assert _get(index + "numpy/")[0] == 200
        assert _wait_for(lambda: wanted in paths()), paths()
        fetched = Counter(paths())
        assert fetched["/simple/packaging/"] == 1
        assert fetched[metadata_path(numpy.filename)] == 1
        assert metadata_path(packaging[2].filename) not in fetched  # excluded by <24
        assert "/simple/pytest/" not in fetched  # only for an extra
        # what uv then asks is answered from what the relay fetched
        (entry,) = json.loads(_get(index + "numpy/")[2])["files"]
        assert _get(entry["url"] + ".metadata", accept="*/*")[0] == 200
        page = json.loads(_get(index + "packaging/")[2])["files"]
        (older,) = [e for e in page if e["filename"] == packaging[1].filename]
        assert b"Version: 23.0" in _get(older["url"] + ".metadata", accept="*/*")[2]
    # nothing fetched twice (uv asking for a page on its own also guesses its newest release)
    assert max(Counter(paths()).values()) == 1 and set(fetched) <= set(paths())


def test_without_the_run_s_pythons_the_relay_fetches_only_what_is_asked(
    chain_index: Any, http_client: ClientFactory
) -> None:
    server, _, _ = chain_index
    with IndexRelay(http_client()) as relay:
        index = relay.index_url(server.index_url("simple"))
        (entry,) = json.loads(_get(index + "numpy/")[2])["files"]
        assert _get(entry["url"] + ".metadata", accept="*/*")[0] == 200
        time.sleep(0.3)
    assert "/simple/packaging/" not in server.stats.paths()
