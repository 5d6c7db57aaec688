"""The client verifies TLS with its CA bundle loaded once per run, not once per connection,
and the bundle still decides: a server it does not vouch for, or a bundle that is no
bundle, fails as before."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from envbuilder.errors import IndexError_
from tests.integration.conftest import ClientFactory

BODY = b"0123456789" * 10


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the server closes each connection: one request, one handshake

    def do_GET(self) -> None:
        body = BODY
        status = 200
        wanted = self.headers.get("Range")
        if wanted:
            start, end = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
            body, status = BODY[start : end + 1], 206
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(BODY)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 in ``directory``."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


@dataclass(frozen=True)
class TlsServer:
    port: int
    bundle: Path  # the server's self-signed certificate: the bundle that vouches for it
    handshakes: list[int]


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsServer]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handshakes: list[int] = []

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> tuple[Any, Any]:
            sock, address = super().get_request()
            handshakes.append(1)
            return context.wrap_socket(sock, server_side=True), address

    server = Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TlsServer(port=server.server_address[1], bundle=cert, handshakes=handshakes)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def bundle_loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Each CA bundle loaded into a TLS context, whoever loads it."""
    loads: list[object] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    return loads


def test_a_bundle_is_loaded_once_for_every_connection(
    http_client: ClientFactory, tls_server: TlsServer, bundle_loads: list[object]
) -> None:
    client = http_client(ca_bundle=str(tls_server.bundle))
    base = f"https://127.0.0.1:{tls_server.port}"
    for n in range(4):
        assert client.get(f"{base}/page-{n}").content == BODY
    assert client.get_range(f"{base}/wheel", 10, 19) == BODY[10:20]  # the range session
    assert len(tls_server.handshakes) == 5  # five connections, each verified
    assert len(bundle_loads) == 1  # before: one load per connection, 5


def test_the_bundle_from_the_environment_is_loaded_once(
    http_client: ClientFactory,
    tls_server: TlsServer,
    bundle_loads: list[object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no bundle configured: requests takes REQUESTS_CA_BUNDLE, as pip's users expect
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_server.bundle))
    client = http_client(ca_bundle=None)
    base = f"https://127.0.0.1:{tls_server.port}"
    for n in range(3):
        assert client.get(f"{base}/page-{n}").content == BODY
    assert len(tls_server.handshakes) == 3
    assert len(bundle_loads) == 1


def test_a_server_the_bundle_does_not_vouch_for_is_refused(
    http_client: ClientFactory, tls_server: TlsServer, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _, other_cert = _self_signed(other)  # for the same address, but not the server's
    client = http_client(ca_bundle=str(other_cert), retries=0)
    for n in range(2):  # the second from the shared context too
        with pytest.raises(IndexError_, match="CERTIFICATE_VERIFY_FAILED"):
            client.get(f"https://127.0.0.1:{tls_server.port}/page-{n}")


def test_a_name_the_certificate_does_not_hold_is_refused(
    http_client: ClientFactory, tls_server: TlsServer
) -> None:
    client = http_client(ca_bundle=str(tls_server.bundle), retries=0)
    assert client.get(f"https://127.0.0.1:{tls_server.port}/page").content == BODY
    with pytest.raises(IndexError_, match=r"CERTIFICATE_VERIFY_FAILED|match"):
        client.get(f"https://localhost:{tls_server.port}/page")  # the certificate names the IP


def test_a_bundle_that_is_no_bundle_fails_every_request(
    http_client: ClientFactory,
    tls_server: TlsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    # the system's default bundle would vouch for the server: it must not stand in
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.bundle))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    client = http_client(ca_bundle=str(junk), retries=0)
    for n in range(2):  # the second request neither
        with pytest.raises(IndexError_):
            client.get(f"https://127.0.0.1:{tls_server.port}/page-{n}")
