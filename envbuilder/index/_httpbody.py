"""A response body read within bounds: of bytes once decoded, and of time in all.

The raw bytes are read as they came (through CacheControl, which keeps them
so) and inflated here with a bound on the output, so a small compressed body
cannot grow into gigabytes in memory (a gzip bomb is refused after
``max_bytes``). A server that keeps the connection alive with a byte now and
then is cut off at the deadline by a `Watchdog`: the socket's read timeout
alone would wait for ever. Only the encodings the client asks for are decoded
(gzip, deflate); any other is refused.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import requests
import urllib3

from envbuilder.errors import IndexError_
from envbuilder.index._httpfailures import Transient, body_cause

__all__ = ["CHUNK", "MAX_BODY", "MAX_FILE", "SLOWEST_RATE", "Watchdog", "bounded_chunks", "decoder"]

#: The most bytes a whole response may hold once decompressed (index pages, ``.metadata``).
MAX_BODY = 64 * 2**20
#: The most bytes a streamed file (`HttpClient.stream`) may hold unless its size is known:
#: beyond the largest wheel on the indexes (torch's CUDA wheels are under 3 GiB).
MAX_FILE = 4 * 2**30
#: The slowest transfer (bytes per second) a stream is given time for, beyond the URL budget.
SLOWEST_RATE = 256 * 1024
#: Raw bytes read at a time from a whole response.
CHUNK = 64 * 1024


class Watchdog:
    """Cut ``resp``'s connection at ``deadline`` (monotonic): a read blocked on it returns."""

    def __init__(self, resp: requests.Response, deadline: float) -> None:
        self.fired = False
        self._resp = resp
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        connection = getattr(self._resp.raw, "_connection", None)
        sock = getattr(connection, "sock", None)
        if not isinstance(sock, socket.socket):
            # a body that ends when the connection does (no length, HTTP/1.0): http.client
            # hands the socket from the connection to the response's reader
            reader = getattr(getattr(self._resp.raw, "_fp", None), "fp", None)
            sock = getattr(getattr(reader, "raw", None), "_sock", None)
        self.fired = True
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def decoder(content_encoding: str, shown: str) -> Any:
    """A zlib decompressor for the body's Content-Encoding (None for identity)."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if codings in (["gzip"], ["x-gzip"]):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if codings == ["deflate"]:
        return zlib.decompressobj()
    raise IndexError_(
        f"GET {shown!r}: unsupported Content-Encoding {content_encoding!r} "
        "(envbuilder asks for gzip or deflate only)"
    )


def bounded_chunks(
    resp: requests.Response,
    *,
    shown: str,
    deadline: float,
    max_bytes: int,
    seconds: float,
    count: Callable[[int], None],
    chunk_size: int = CHUNK,
) -> Iterator[bytes]:
    """The body's chunks, decoded, read by ``deadline`` (*seconds* after the start, for
    the message) and at most ``max_bytes`` long in all; ``count`` is told the raw
    bytes of each chunk that came over the network (not from the cache).

    A body that broke off is `Transient`; one too large, too slow or badly
    compressed is `IndexError_`, naming ``shown`` (the URL without its password).
    """
    decoding = decoder(resp.headers.get("content-encoding", ""), shown)
    counted = not getattr(resp, "from_cache", False)
    watchdog = Watchdog(resp, deadline)
    size = transferred = 0
    try:
        while True:
            try:
                chunk = resp.raw.read(chunk_size, decode_content=False)
            except (
                requests.exceptions.RequestException,
                urllib3.exceptions.HTTPError,
                OSError,
            ) as e:
                if watchdog.fired:
                    break
                raise Transient(body_cause(e)) from e
            if watchdog.fired or not chunk:
                break
            transferred += len(chunk)
            if counted:
                count(len(chunk))
            if decoding is not None:
                try:
                    chunk = decoding.decompress(chunk, max_bytes + 1 - size)
                except zlib.error as e:
                    raise IndexError_(f"GET {shown!r}: the compressed body is broken: {e}") from e
            size += len(chunk)
            if size > max_bytes or transferred > max_bytes:
                raise IndexError_(
                    f"GET {shown!r}: the body is larger than {max_bytes} bytes"
                    f"{' once decompressed' if decoding is not None else ''}; refusing it "
                    "(a decompression bomb or the wrong URL?)"
                )
            if chunk:
                yield chunk
    finally:
        watchdog.cancel()
    if watchdog.fired:
        raise IndexError_(
            f"GET {shown!r}: the body was not read within {seconds:.0f} s in all "
            f"({transferred} bytes came; a server sending it too slowly?)"
        )
    if decoding is not None and not decoding.eof and transferred:
        raise Transient("the compressed body ends early")
