"""Fixtures for integration tests: real wheels, a loopback index, an HTTP client.

def test_x(wheel_factory, index_server, http_client):
    w = wheel_factory("xformers", "0.0.28.post1", requires_dist=["torch==2.4.1"])
    server = index_server({"xformers": [w]})            # started; stopped after the test
    page = fetch_project_page(http_client(), server.index_url("simple"), "xformers")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from envbuilder.index.http import HttpClient
from tests.support.index_server import IndexedFile, IndexServer
from tests.support.wheels import BuiltWheel, build_wheel

WheelFactory = Callable[..., BuiltWheel]
ServerFactory = Callable[..., IndexServer]
ClientFactory = Callable[..., HttpClient]


@pytest.fixture
def wheel_factory(tmp_path_factory: pytest.TempPathFactory) -> WheelFactory:
    """``wheel_factory(name, version, **build_wheel_kwargs)`` -> a real wheel in a temp dir."""
    directory = tmp_path_factory.mktemp("wheels")

    def make(name: str, version: str, **kwargs: Any) -> BuiltWheel:
        return build_wheel(directory, name, version, **kwargs)

    return make


@pytest.fixture
def index_server() -> Iterator[ServerFactory]:
    """``index_server(projects, prefix="simple", **switches)`` -> a started `IndexServer`."""
    started: list[IndexServer] = []

    def make(
        projects: Mapping[str, Sequence[IndexedFile | BuiltWheel]] | None = None,
        *,
        prefix: str = "simple",
        **switches: Any,
    ) -> IndexServer:
        server = IndexServer(**switches)
        if projects is not None:
            server.add_index(prefix, projects)
        started.append(server.start())
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def http_client(tmp_path: Path) -> Iterator[ClientFactory]:
    """``http_client(**HttpClient_kwargs)``; the cache is one temp dir shared by the test's clients."""
    clients: list[HttpClient] = []

    def make(**kwargs: Any) -> HttpClient:
        kwargs.setdefault("cache_dir", tmp_path / "cache")
        kwargs.setdefault("backoff_factor", 0.01)
        kwargs.setdefault("timeout", 10)
        client = HttpClient(**kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
