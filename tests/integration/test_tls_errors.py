"""A TLS failure that asking again cannot change (the server speaks plain HTTP, or another
TLS version) fails at once, not after every retry."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from envbuilder.errors import IndexError_
from tests.integration.conftest import ClientFactory


@pytest.fixture
def plain_http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_https_to_a_plain_http_server_fails_on_the_first_attempt(
    http_client: ClientFactory, plain_http_port: int
) -> None:
    client = http_client(retries=5, backoff_factor=0.5)
    start = time.monotonic()
    with pytest.raises(IndexError_) as raised:
        client.get(f"https://127.0.0.1:{plain_http_port}/compat.lock.json")
    elapsed = time.monotonic() - start
    message = str(raised.value)
    assert "after retries" not in message  # one attempt, no back-off
    assert "SSL" in message or "TLS" in message or "ssl" in message
    assert elapsed < 5  # five retries at 0.5 s back-off would take 15.5 s
