"""The short timeout of the calls that answer at once (`_quick`), on the one docker-py
client a build's threads share: it shortens the calls of the thread inside the block,
never a long call another thread makes meanwhile (a log stream, a layer's load).

A local HTTP server plays the daemon; each path answers after a set delay."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

docker = pytest.importorskip("docker", reason="docker-py is not installed (the `docker` extra)")
requests = pytest.importorskip("requests")

from envbuilder.docker import daemon  # noqa: E402
from envbuilder.docker.daemon import _quick  # noqa: E402

API = "1.41"
SHORT = 0.5
LONG = 30
SLOW_S = 2.0  # the slow call's answer: past SHORT, well inside LONG


class _Daemon(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.slow_asked = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    server: _Daemon

    def do_GET(self) -> None:
        if self.path.startswith(f"/v{API}/containers/json"):  # the slow call
            self.server.slow_asked.set()
            time.sleep(SLOW_S)
        body = json.dumps([]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(daemon, "_QUICK_TIMEOUT_S", SHORT)
    server = _Daemon()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    made = docker.DockerClient(base_url=f"tcp://127.0.0.1:{port}", version=API, timeout=LONG)
    made.api.slow_asked = server.slow_asked
    try:
        yield made
    finally:
        made.close()
        server.shutdown()
        server.server_close()


def test_a_long_call_of_another_thread_keeps_the_long_timeout(
    client: Any,
) -> None:
    """The compiler's thread holds a quick block while the main thread starts a call that
    answers after 2 s: that call must not get the block's 0.5 s."""
    block_open, slow_started = threading.Event(), threading.Event()
    outcome: list[object] = []

    def other() -> None:
        with _quick(client):
            block_open.set()
            slow_started.wait(10)
            client.api.slow_asked.wait(10)  # the slow request is on the wire

    thread = threading.Thread(target=other)
    thread.start()
    block_open.wait(10)
    slow_started.set()
    try:
        outcome.append(client.api.containers())
    except requests.exceptions.RequestException as e:
        outcome.append(e)
    thread.join(10)
    assert outcome == [[]]


def test_a_call_inside_a_block_gives_up_after_the_short_timeout(
    client: Any,
) -> None:
    with _quick(client), pytest.raises(requests.exceptions.ReadTimeout):
        client.api.containers()
    assert client.api.containers() == []  # outside the block the long timeout again


def test_a_nested_block_keeps_the_short_timeout_until_the_outer_one_closes(
    client: Any,
) -> None:
    with _quick(client):
        with _quick(client):
            pass
        with pytest.raises(requests.exceptions.ReadTimeout):
            client.api.containers()
    assert client.api.images() == []


def test_a_client_already_quicker_keeps_its_own_timeout(client: Any) -> None:
    client.api.timeout = 0.2
    with _quick(client):
        asked = client.api._set_request_timeout({})  # what docker-py gives each request
    assert asked == {"timeout": 0.2}
    with _quick(client):
        named = client.api._set_request_timeout({"timeout": 7})
    assert named == {"timeout": 7}  # a call that names its timeout keeps it


def test_a_client_without_docker_py_s_timeout_hook_is_left_alone() -> None:
    class Api:
        timeout = LONG

    class Client:
        api = Api()

    with _quick(Client()):  # type: ignore[arg-type]
        assert Client.api.timeout == LONG
