"""The relay served from a process of its own: the same answers as in the run's process,
its requests counted in the run's, and a process that cannot start is a clear error."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from envbuilder.credentials import Credentials
from envbuilder.errors import EnvbuilderError
from envbuilder.index.relayproc import RelayProcess
from envbuilder.index.simple import JSON_TYPE
from tests.integration.conftest import ServerFactory, WheelFactory


def _get(url: str, accept: str = JSON_TYPE) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept})) as r:
        body: bytes = r.read()
        return body


@pytest.fixture
def numpy_server(wheel_factory: WheelFactory, index_server: ServerFactory) -> Any:
    wheel = wheel_factory("numpy", "2.0.0", requires_dist=["packaging>=20"])
    return index_server({"numpy": [wheel]}, format="json", advertise_metadata=False), wheel


def test_the_process_serves_pages_and_metadata_and_restores_urls(
    numpy_server: Any, tmp_path: Path
) -> None:
    server, wheel = numpy_server
    options = {"cache_dir": tmp_path / "cache", "offline": False, "max_workers": 2}
    options["credentials"] = Credentials({"other.example:8080": ("user", "secret")})
    relay = RelayProcess(options, platforms={"any"}, pythons={"3.11"})
    with relay:
        index = relay.index_url(server.index_url("simple"))
        assert relay.index_url(server.index_url("simple")) == index  # asked once, kept
        assert index.startswith("http://127.0.0.1:")
        (entry,) = json.loads(_get(index + "numpy/"))["files"]
        assert entry["url"].startswith(index.split("/i/")[0] + "/f/")
        metadata = _get(entry["url"] + ".metadata", accept="*/*")
        assert b"Requires-Dist: packaging>=20" in metadata
        lock = f'url = "{entry["url"]}"\nmore\n'
        assert relay.restore(lock) == f'url = "{server.file_url("simple", wheel.filename)}"\nmore\n'
        assert relay.restore("") == ""
    assert relay.requests_made >= 2  # the page and the wheel's metadata, by ranges
    assert relay.bytes_downloaded > 0
    assert (tmp_path / "cache" / "blobs").is_dir()  # the run's own cache directory


def test_a_process_that_does_not_start_is_an_error_naming_the_relay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))
    relay = RelayProcess({"cache_dir": None})
    stopped = r"index relay's process stopped \(exit code 3\)"
    with pytest.raises(EnvbuilderError, match=stopped), relay:
        relay.index_url("https://example.invalid/simple/")


def test_a_client_the_process_cannot_make_is_an_error_naming_it(tmp_path: Path) -> None:
    relay = RelayProcess({"max_workers": "many"})
    failed = "index relay's process failed: TypeError"
    with pytest.raises(EnvbuilderError, match=failed), relay:
        relay.index_url("https://example.invalid/simple/")


def test_options_the_process_cannot_be_given_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="no client option \\['retries'\\]"):
        RelayProcess({"retries": 2})
