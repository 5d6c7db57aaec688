"""A loopback HTTPS (CONNECT) proxy that counts the bytes it relays.

Benchmarks route every client they measure — envbuilder, and the uv
processes it or the benchmark starts — through it via ``HTTPS_PROXY``, so
"bytes downloaded" is measured the same way for everyone, TLS included.
"""

from __future__ import annotations

import selectors
import socket
import socketserver
import threading
from typing import Any

__all__ = ["CountingProxy"]

_BUFFER = 256 * 1024


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        request_line = self.rfile.readline(65536).decode("latin-1").strip()
        while self.rfile.readline(65536) not in (b"\r\n", b"\n", b""):
            pass
        method, _, rest = request_line.partition(" ")
        target = rest.split(" ", 1)[0]
        if method != "CONNECT" or ":" not in target:
            self.wfile.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=30)
        except OSError:
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        self.server.owner.count(connections=1)
        self._relay(self.connection, upstream)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()  # epoll: no FD_SETSIZE limit under many connections
        selector.register(client, selectors.EVENT_READ)
        selector.register(upstream, selectors.EVENT_READ)
        try:
            while True:
                events = selector.select(timeout=120)
                if not events:
                    return
                for key, _ in events:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    data = sock.recv(_BUFFER)
                    if not data:
                        return
                    if sock is upstream:
                        self.server.owner.count(down=len(data))
                        client.sendall(data)
                    else:
                        self.server.owner.count(up=len(data))
                        upstream.sendall(data)
        except OSError:
            return
        finally:
            selector.close()
            upstream.close()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: CountingProxy


class CountingProxy:
    """``with CountingProxy() as proxy: env["HTTPS_PROXY"] = proxy.url``; read ``proxy.down``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down = 0
        self.up = 0
        self.connections = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def count(self, *, down: int = 0, up: int = 0, connections: int = 0) -> None:
        with self._lock:
            self.down += down
            self.up += up
            self.connections += connections

    def snapshot(self) -> int:
        with self._lock:
            return self.down

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
