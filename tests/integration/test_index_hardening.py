"""The index client against a loopback index that is hostile or broken in ways a proxy,
a captive portal or a typo produce: nothing secret written, every body bounded in time
and size, nothing wrong taken as evidence or kept in a cache.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from envbuilder.credentials import Credentials
from envbuilder.errors import IndexError_
from envbuilder.index import http as index_http
from envbuilder.index.http import HttpClient
from envbuilder.index.remotewheel import read_core_metadata, read_member
from envbuilder.index.simple import fetch_project_page
from tests.integration.conftest import ClientFactory, ServerFactory, WheelFactory
from tests.integration.test_resolver import (  # the resolver's wheels, index layout and runner
    OK,
    Wheels,
    _matrix,
    _server,
    resolve,
    uv,
    wheels,
)
from tests.support.signals import sigint_at_default
from tests.support.wheels import BuiltWheel, build_wheel

__all__ = ["resolve", "uv", "wheels"]  # fixtures, used by name

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
MAX_MEMBER = 16 * 2**20  # remotewheel.MAX_MEMBER
MAX_BODY = 64 * 2**20  # http.MAX_BODY
PORTAL = (
    b"<!DOCTYPE html><html><head><title>Sign in to the network</title></head>"
    b'<body><a href="/login">Sign in</a></body></html>'
)


def _every_byte(root: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


# -- 2: a response that varies on Authorization ------------------------------------------------


def test_a_page_varying_on_authorization_is_not_stored_with_the_password(
    wheel_factory: WheelFactory, index_server: ServerFactory, tmp_path: Path
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server(
        {"six": [six]},
        basic_auth=("user", SECRET),
        vary="Accept, Authorization",
        cache_control="max-age=600",
    )
    host = server.url.removeprefix("http://")
    cache = tmp_path / "cache"
    credentials = Credentials({host: ("user", SECRET)})
    with HttpClient(cache_dir=cache, credentials=credentials) as client:
        page = fetch_project_page(client, server.index_url("simple"), "six")
        read_core_metadata(client, page.files[0])
    assert [f.filename for f in page.files] == [six.filename]
    stored = _every_byte(cache)
    token = base64.b64encode(f"user:{SECRET}".encode())
    assert token not in stored, "the Authorization header is in the HTTP cache"
    assert SECRET.encode() not in stored


# -- 3: the netrc and uv on SIGTERM ------------------------------------------------------------


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # the thread ended while its process was being listed
            continue
        found.update(int(c) for c in children)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_envbuilder_alone_stops_uv_and_leaves_no_password(
    wheels: Wheels, tmp_path: Path, uv: str, sig: signal.Signals
) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with _server(wheels, basic_auth=("user", SECRET)) as server:
        server.hang_paths.add("/simple/nvidia-cuda-runtime-cu12/")  # asked by uv alone
        authed = server.url.replace("http://", f"http://user:{SECRET}@")
        matrix = _matrix(tmp_path, authed + "/simple", authed + "/whl/{cuda}")
        argv = ["resolve", "--matrix", str(matrix), "--out", str(tmp_path / "locks"), OK]
        proc = subprocess.Popen(
            [sys.executable, "-m", "envbuilder", *argv, "--cache-dir", str(tmp_path / "c")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)},
            start_new_session=True,  # the signal goes to envbuilder only, not its group
            preexec_fn=sigint_at_default,
        )
        deadline = time.monotonic() + 60
        while not _uv_children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # uv has started and asks the hung page
        uv_pids = _uv_children(proc.pid)
        assert uv_pids, "uv was not running"
        proc.send_signal(sig)
        proc.communicate(timeout=20)
        stopped = time.monotonic() + 10
        while any(_alive(p) for p in uv_pids) and time.monotonic() < stopped:
            time.sleep(0.1)
    assert not any(_alive(p) for p in uv_pids), "uv kept running after envbuilder ended"
    assert SECRET.encode() not in _every_byte(tmpdir), "the password was left in TMPDIR"


def _uv_children(pid: int) -> set[int]:
    found = set()
    for child in _children(pid):
        try:
            if b"uv" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]:
                found.add(child)
        except FileNotFoundError:
            continue
    return found


# -- 4 and 24: a captive portal (or malformed metadata) at <wheel>.metadata --------------------


@pytest.mark.parametrize(
    ("served", "content_type", "problem"),
    [
        (PORTAL, "text/html", "an HTML page instead of core metadata"),
        (b"Name: torch\nVersion: 2.4.1\n\n", "text/plain", "no Metadata-Version"),
        (
            b"Metadata-Version: 2.1\nName: six\nVersion: 1.0\n\n",
            "text/plain",
            "Name 'six' is not the wheel's 'torch'",
        ),
    ],
    ids=["portal", "no-metadata-version", "another-project"],
)
def test_metadata_that_is_not_the_wheels_is_an_error_never_evidence_nor_cached(
    wheels: Wheels, tmp_path: Path, resolve: Any, served: bytes, content_type: str, problem: str
) -> None:
    with _server(wheels, metadata_hash=False) as server:  # `core-metadata: true`, no hash
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        first = resolve(matrix, OK)
        assert first.by_id()[OK]["status"] == "resolved"
        server.serve_metadata_as("simple", wheels.torch241.filename, served, content_type)
        broken = resolve(matrix, OK, "--upgrade", cache=tmp_path / "fresh-cache")
        answer = broken.by_id()[OK]
        assert (broken.rc, answer["status"]) == (1, "error"), answer
        assert problem in answer["reason"]
        assert wheels.torch241.filename + ".metadata" in answer["reason"]
        assert broken.written()[OK] == first.written()[OK]  # the earlier answer stands
        server.serve_metadata_as("simple", wheels.torch241.filename, b"")
        recovered = resolve(matrix, OK, cache=tmp_path / "fresh-cache")
        assert (recovered.rc, recovered.by_id()[OK]["status"]) == (0, "resolved")


# -- 5: metadata checked against the hash of either PEP 714 key; a swapped file refused -----------


def test_metadata_is_checked_against_the_older_dist_info_metadata_hash(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]})
    right = hashlib.sha256(six.metadata).hexdigest()
    page = (
        f'<!DOCTYPE html><html><body><a href="../files/{six.filename}#sha256={six.sha256}" '
        f'data-core-metadata="true" data-dist-info-metadata="sha256={right}">{six.filename}</a></body></html>'
    )
    server.serve_page("simple", "six", page.encode(), {"Content-Type": "text/html"})
    other = b"Metadata-Version: 2.1\nName: six\nVersion: 1.16.0\nRequires-Dist: evil\n\n"
    server.serve_metadata_as("simple", six.filename, other)
    client = http_client()
    (file,) = fetch_project_page(client, server.index_url("simple"), "six").files
    assert file.core_metadata == {"sha256": right}
    with pytest.raises(IndexError_, match="does not match the index's"):
        read_core_metadata(client, file)


def test_a_wheel_of_another_size_than_the_index_lists_is_refused(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]}, advertise_metadata=False, format="json")
    doc = json.loads(server.render_json("simple", "six"))
    doc["files"][0]["size"] = six.size + 1000
    server.serve_page("simple", "six", json.dumps(doc).encode(), {"Content-Type": JSON_TYPE})
    client = http_client()
    (file,) = fetch_project_page(client, server.index_url("simple"), "six").files
    with pytest.raises(IndexError_, match="where the index lists"):
        read_core_metadata(client, file)
    assert client.cache_get("anything") is None


# -- 6: a body that trickles ---------------------------------------------------------------------


def test_a_body_that_trickles_is_cut_off_at_the_url_budget(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]}, trickle=0.05)
    client = http_client(timeout=1, url_budget=1.5)
    started = time.monotonic()
    with pytest.raises(IndexError_, match=r"not read within 2 s in all"):
        fetch_project_page(client, server.index_url("simple"), "six")
    assert time.monotonic() - started < 4


# -- 7: decompression bombs ----------------------------------------------------------------------


def test_a_gzip_bomb_page_is_refused_in_bounded_memory(
    index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({})
    server.add_index("simple", {})
    bomb = gzip.compress(b'{"meta": {"api-version": "1.1"}, "files": [' + b" " * (300 * 2**20))
    server.serve_page(
        "simple", "six", bomb, {"Content-Type": JSON_TYPE, "Content-Encoding": "gzip"}
    )
    client = http_client()
    tracemalloc.start()
    try:
        with pytest.raises(IndexError_, match="larger than 67108864 bytes once decompressed"):
            fetch_project_page(client, server.index_url("simple"), "six")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_BODY, f"peak {peak / 2**20:.0f} MiB"


def _bomb_wheel(directory: Path, member: str, data: bytes) -> BuiltWheel:
    """A real wheel (zip) of project bomb 1.0 whose ``member`` holds ``data``, deflated."""
    filename = "bomb-1.0-py3-none-any.whl"
    path = directory / filename
    metadata = b"Metadata-Version: 2.1\nName: bomb\nVersion: 1.0\n\n"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/__init__.py", b"")
        archive.writestr("bomb-1.0.dist-info/METADATA", metadata)
        archive.writestr(member, data)
    raw = path.read_bytes()
    return BuiltWheel(
        path=path,
        name="bomb",
        version="1.0",
        filename=filename,
        sha256=hashlib.sha256(raw).hexdigest(),
        size=len(raw),
        metadata=metadata,
        requires_python=None,
    )


@pytest.mark.parametrize("ranges", [True, False], ids=["by-ranges", "whole-archive"])
def test_a_member_that_inflates_past_the_bound_is_refused(
    index_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, ranges: bool
) -> None:
    huge = b"x" * (MAX_MEMBER + 2**20)
    wheel = _bomb_wheel(tmp_path, "xformers/cpp_lib.json", huge)
    assert wheel.size < 200_000
    server = index_server({"bomb": [wheel]}, advertise_metadata=False)
    client = http_client()
    (file,) = fetch_project_page(client, server.index_url("simple"), "bomb").files
    local = file if ranges else type(file)(filename=file.filename, url=wheel.path.as_uri())
    with pytest.raises(IndexError_, match="more than 16777216"):
        read_member(client, local, "xformers/cpp_lib.json")
    assert sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file()) < 2**20


# -- 10, 15, 16: pages that say something else than "no files" ---------------------------------


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"hashes": ["sha256"]}, "'hashes' is ['sha256'], not a dict"),
        ({"filename": 7}, "'filename' is 7, not a str"),
        ({"yanked": 1}, "'yanked' is 1, not a bool or str"),
        ({"url": "file:///etc/passwd"}, "'file:///etc/passwd', which is not an http(s) URL"),
    ],
)
def test_a_json_page_with_a_bad_file_entry_is_an_error(
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    http_client: ClientFactory,
    edit: dict[str, Any],
    problem: str,
) -> None:
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]}, format="json")
    doc = json.loads(server.render_json("simple", "six"))
    doc["files"][0].update(edit)
    server.serve_page("simple", "six", json.dumps(doc).encode(), {"Content-Type": JSON_TYPE})
    with pytest.raises(IndexError_) as raised:
        fetch_project_page(http_client(), server.index_url("simple"), "six")
    assert problem in str(raised.value)
    assert server.index_url("simple") + "/six/" in str(raised.value)


def test_a_404_for_the_index_itself_is_an_error_and_for_a_project_an_empty_page(
    wheel_factory: WheelFactory, index_server: ServerFactory, http_client: ClientFactory
) -> None:
    server = index_server({"six": [wheel_factory("six", "1.16.0")]})
    client = http_client()
    assert fetch_project_page(client, server.index_url("simple"), "nosuch").files == ()
    with pytest.raises(IndexError_, match=r"does not exist \(HTTP 404 for the index itself"):
        fetch_project_page(client, server.index_url("simpel"), "six")


# -- 17: uv gets the deadline --------------------------------------------------------------------


def test_a_hung_page_asked_only_by_uv_costs_the_url_budget(
    wheels: Wheels, tmp_path: Path, resolve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_http, "DEFAULT_TIMEOUT", 2.0, raising=False)
    monkeypatch.setattr(index_http, "DEFAULT_URL_BUDGET", 4.0, raising=False)
    for name in ("UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    with _server(wheels) as server:
        server.hang_paths.add("/simple/nvidia-cuda-runtime-cu12/")
        matrix = _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")
        started = time.monotonic()
        run = resolve(matrix, OK)
        took = time.monotonic() - started
    assert run.by_id()[OK]["status"] == "error"
    assert took < 20, f"uv took {took:.0f} s on a hung page"


# -- 23: a read-only cache -----------------------------------------------------------------------


def test_a_cache_that_cannot_be_written_is_read_and_warned_about_not_a_connection_error(
    wheel_factory: WheelFactory,
    index_server: ServerFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Root writes into read-only directories, so the cache's directories are files here:
    writing fails with an OSError all the same."""
    six = wheel_factory("six", "1.16.0")
    server = index_server({"six": [six]}, advertise_metadata=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "http").write_bytes(b"")
    (cache / "blobs").write_bytes(b"")
    with HttpClient(cache_dir=cache) as client:
        page = fetch_project_page(client, server.index_url("simple"), "six")
        read_core_metadata(client, page.files[0])
    assert [f.filename for f in page.files] == [six.filename]
    assert "cannot write the HTTP cache" in caplog.text


# -- 8: one bad file is that combination's error ---------------------------------------------


def test_a_deeply_nested_build_record_is_one_combinations_error(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    nested = build_wheel(
        tmp_path / "bad",
        "xformers",
        "0.0.28.post2",
        tags="cp311-cp311-manylinux_2_28_x86_64",
        requires_dist=["torch==2.4.1"],
        members={"xformers/cpp_lib.json": b"[" * 100_000 + b"]" * 100_000},
    )
    server = _server(wheels)
    server.add_index("simple", {"xformers": [nested]})
    with server:
        matrix = _matrix(
            tmp_path,
            server.index_url("simple"),
            server.index_url("whl") + "/{cuda}",
            rows=BAD_ROWS,
        )
        run = resolve(matrix)
    answers = run.by_id()
    assert run.rc == 1
    assert answers[OK]["status"] == "resolved"
    bad = answers["py3.11-cu121-torch2.4.1-xformers0.0.28.post2"]
    assert bad["status"] == "error"
    assert "nested deeper than" in bad["reason"]


BAD_ROWS = """
[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post1"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post2"
"""


def test_metadata_that_is_not_utf8_is_an_error_naming_the_wheel(
    index_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    wheel = _bomb_wheel(tmp_path, "bomb/data.txt", b"")
    path = tmp_path / "latin1" / wheel.filename
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "bomb-1.0.dist-info/METADATA",
            b"Metadata-Version: 2.1\nName: bomb\nVersion: 1.0\nSummary: caf\xe9\n\n",
        )
    raw = path.read_bytes()
    latin1 = BuiltWheel(
        path=path,
        name="bomb",
        version="1.0",
        filename=wheel.filename,
        sha256=hashlib.sha256(raw).hexdigest(),
        size=len(raw),
        metadata=b"",
        requires_python=None,
    )
    server = index_server({"bomb": [latin1]}, advertise_metadata=False)
    client = http_client()
    (file,) = fetch_project_page(client, server.index_url("simple"), "bomb").files
    with pytest.raises(IndexError_, match=r"METADATA is not UTF-8 \(byte 58"):
        read_core_metadata(client, file)


def test_a_wrong_typed_build_record_is_one_combinations_error_saying_malformed(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    wrong = build_wheel(
        tmp_path / "bad",
        "xformers",
        "0.0.28.post2",
        tags="cp311-cp311-manylinux_2_28_x86_64",
        requires_dist=["torch==2.4.1"],
        members={"xformers/cpp_lib.json": b'{"version": {"torch": 2.4, "cuda": [12, 1]}}'},
    )
    server = _server(wheels)
    server.add_index("simple", {"xformers": [wrong]})
    with server:
        matrix = _matrix(
            tmp_path,
            server.index_url("simple"),
            server.index_url("whl") + "/{cuda}",
            rows=BAD_ROWS,
        )
        run = resolve(matrix)
    answers = run.by_id()
    assert answers[OK]["status"] == "resolved"
    bad = answers["py3.11-cu121-torch2.4.1-xformers0.0.28.post2"]
    assert bad["status"] == "error", bad
    assert "malformed xformers/cpp_lib.json: 'version.torch' is a float (2.4)" in bad["reason"]
    assert "built with torch None" not in bad["reason"]
