"""HTTP for package indexes: caching, retries, range reads, offline mode, byte counts.

Whole responses (index pages, ``.metadata`` files) go through CacheControl
with a ``FileCache`` under ``<cache_dir>/http``: they are revalidated with
ETag / Last-Modified, and a response that carries neither validators nor a
freshness lifetime is kept for ``page_ttl`` seconds so that ``offline`` runs
have something to serve. Range responses (206) are never cached by
CacheControl; callers keep what they derive from them in the small
content-addressed store (``cache_get`` / ``cache_put``), keyed by the file's
sha256 where known - files on an index are immutable.

Every body is bounded: read within the URL's time budget in all (a server
trickling a byte at a time is cut off, not only one that stops), and no
larger than ``max_bytes`` once decompressed (a gzip bomb is refused after
``max_bytes``, not inflated in memory). A streamed file (`HttpClient.stream`)
is bounded the same way, by its size where the caller knows it. A response that varies on a
header carrying a secret (``Vary: Authorization``) is never written to the
cache: CacheControl would store the request's header beside it.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import logging
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import urllib3
from cachecontrol import CacheControlAdapter
from cachecontrol.caches import FileCache
from cachecontrol.controller import CacheController
from cachecontrol.heuristics import BaseHeuristic
from requests.adapters import HTTPAdapter
from urllib3 import HTTPResponse

from envbuilder import __version__
from envbuilder.credentials import Credentials
from envbuilder.errors import HttpNotFound, IndexError_
from envbuilder.files import atomic_writer

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL_BUDGET",
    "MAX_BODY",
    "MAX_FILE",
    "RETRY_STATUSES",
    "SECRET_HEADERS",
    "SLOWEST_RATE",
    "HttpClient",
    "HttpNotFound",
    "HttpResponse",
]

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Seconds one read may wait, and one URL may take in all, retries included.
DEFAULT_TIMEOUT = 30.0
DEFAULT_URL_BUDGET = 90.0
#: The most bytes a whole response may hold once decompressed (index pages, ``.metadata``).
MAX_BODY = 64 * 2**20
#: The most bytes a streamed file (`HttpClient.stream`) may hold unless its size is known:
#: beyond the largest wheel on the indexes (torch's CUDA wheels are under 3 GiB).
MAX_FILE = 4 * 2**30
#: The slowest transfer (bytes per second) a stream is given time for, beyond the URL budget.
SLOWEST_RATE = 256 * 1024
#: Request headers that carry a secret: a response that varies on one is not cached.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_CHUNK = 64 * 1024
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Transient(Exception):
    """A body that broke off mid-stream (reset, shorter than its Content-Length): retried."""


_T = TypeVar("_T")
#: failures before a response that may pass: retried
_TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


@dataclass(frozen=True, kw_only=True)
class HttpResponse:
    """A fully read response. ``url`` is the final URL, after redirects."""

    url: str
    status: int
    headers: Mapping[str, str]
    content: bytes
    from_cache: bool = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


@dataclass(kw_only=True)
class _Counters:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests_made: int = 0
    bytes_downloaded: int = 0

    def add_request(self) -> None:
        with self.lock:
            self.requests_made += 1

    def add_bytes(self, n: int) -> None:
        with self.lock:
            self.bytes_downloaded += n


class _KeepUnvalidated(BaseHeuristic):
    """Keep a response that has no validators and no lifetime for ``ttl`` seconds."""

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl

    def update_headers(self, response: HTTPResponse) -> dict[str, str]:
        headers = response.headers
        if any(h in headers for h in ("etag", "last-modified", "cache-control", "expires")):
            return {}
        out = {"cache-control": f"max-age={self.ttl}"}
        if "date" not in headers:
            out["date"] = email.utils.formatdate(usegmt=True)
        return out

    def warning(self, response: HTTPResponse) -> str | None:
        return None


class _Controller(CacheController):
    """CacheControl's controller, except that a response varying on a secret header is
    not stored: the cache entry would hold the request's value of that header
    (``Authorization: Basic <user:password>``), and CI saves and restores caches."""

    def _cache_set(
        self, cache_url: str, request: Any, response: HTTPResponse, *args: Any, **kwargs: Any
    ) -> None:
        varied = {h.strip().lower() for h in response.headers.get("vary", "").split(",")}
        secret = sorted(h for h in varied & SECRET_HEADERS if h in request.headers)
        if secret:
            logger.debug("not caching %s: the response varies on %s", cache_url, secret)
            return
        super()._cache_set(cache_url, request, response, *args, **kwargs)


class _OfflineController(_Controller):
    """Serve whatever is cached, however stale: there is no network to revalidate with."""

    def cached_request(self, request: Any) -> Any:
        cached = self._load_from_cache(request)
        return cached if cached is not None else False


class _TolerantFileCache(FileCache):
    """A `FileCache` that a directory it cannot write to does not stop: a run on a
    read-only cache warns once and goes on without storing (it still reads)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self._warned = False

    def _unwritable(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "cannot write the HTTP cache in %s (%s); going on without storing pages",
                self.directory,
                e.strerror or e,
            )

    def get(self, key: str) -> bytes | None:
        try:
            return super().get(key)
        except OSError as e:  # a directory on the way is a file, say
            self._unwritable(e)
            return None

    def set(self, key: str, value: bytes, expires: Any = None) -> None:
        try:
            super().set(key, value, expires)
        except OSError as e:
            self._unwritable(e)

    def delete(self, key: str) -> None:
        try:
            super().delete(key)
        except OSError as e:
            self._unwritable(e)


class _NetworkGate(HTTPAdapter):
    """The last adapter before the wire: counts requests, refuses them when offline."""

    def __init__(self, *args: Any, counters: _Counters, offline: bool, **kwargs: Any) -> None:
        self._counters = counters
        self._offline = offline
        super().__init__(*args, **kwargs)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> requests.Response:
        if self._offline:
            raise IndexError_(
                f"offline: {request.url!r} is not in the cache; run once online to fill it"
            )
        self._counters.add_request()
        return super().send(request, *args, **kwargs)


class _CachingGate(CacheControlAdapter, _NetworkGate):
    pass


class HttpClient:
    """One HTTP session for every index request of a run; safe to share between threads.

    Every request is retried the same way, whether it failed at the connection,
    the status line (429, 5xx, honouring Retry-After) or in the middle of the
    body (a reset, a body shorter than its Content-Length): up to ``retries``
    more attempts with exponential backoff, within ``url_budget`` seconds for
    the URL in all. A URL that still fails is remembered: asking for it again
    in the same run fails at once with the same message. `cancel` (Ctrl-C)
    makes every request in flight or to come fail at its next step.
    """

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        offline: bool = False,
        ca_bundle: str | None = None,
        retries: int = 4,
        timeout: float = DEFAULT_TIMEOUT,
        backoff_factor: float = 0.5,
        url_budget: float = DEFAULT_URL_BUDGET,
        page_ttl: int = 600,
        max_workers: int = 8,
        credentials: Credentials | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        self.credentials = credentials or Credentials()
        self.offline = offline
        self.timeout = timeout
        self.retries = retries
        self.backoff_factor = backoff_factor
        self.url_budget = url_budget
        self.max_workers = max_workers
        self._counters = _Counters()
        self._verify: bool | str = ca_bundle if ca_bundle else True
        self._failed: dict[str, str] = {}
        self._exists: dict[str, bool | None] = {}
        self._failed_lock = threading.Lock()
        self._cancelled = threading.Event()
        pool = max(10, max_workers)
        gate_kwargs: dict[str, Any] = {
            "counters": self._counters,
            "offline": offline,
            "max_retries": 0,  # retried here, body reads included, under one time budget
            "pool_connections": pool,
            "pool_maxsize": pool,
        }
        self._session = requests.Session()
        self._session.headers["User-Agent"] = f"envbuilder/{__version__}"
        # Only the encodings `_Body` decodes itself, bounded (not brotli or zstd).
        self._session.headers["Accept-Encoding"] = "gzip, deflate"
        self._cache: FileCache | None = None
        self._blobs_warned = False
        if cache_dir is not None:
            self._cache = _TolerantFileCache(str(cache_dir / "http"))
            adapter: HTTPAdapter = _CachingGate(
                cache=self._cache,
                heuristic=_KeepUnvalidated(page_ttl),
                controller_class=_OfflineController if offline else _Controller,
                **gate_kwargs,
            )
        else:
            adapter = _NetworkGate(**gate_kwargs)
        # Range reads bypass the HTTP cache: a cached full body must never answer a Range.
        self._range_adapter = _NetworkGate(**gate_kwargs)
        for prefix in ("http://", "https://"):
            self._session.mount(prefix, adapter)
        self._range_session = requests.Session()
        self._range_session.headers["User-Agent"] = self._session.headers["User-Agent"]
        for prefix in ("http://", "https://"):
            self._range_session.mount(prefix, self._range_adapter)

    # -- counters ---------------------------------------------------------------------------

    @property
    def requests_made(self) -> int:
        """Requests sent over the network (cache hits not included; each attempt counts)."""
        return self._counters.requests_made

    @property
    def bytes_downloaded(self) -> int:
        """Body bytes received over the network, not served from the cache."""
        return self._counters.bytes_downloaded

    def close(self) -> None:
        self._session.close()
        self._range_session.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cancel(self) -> None:
        """Stop: requests in flight fail at their next step, new ones at once (Ctrl-C)."""
        self._cancelled.set()

    def forget(self, url: str) -> None:
        """Drop ``url``'s cached response: what it said turned out not to be usable."""
        if self._cache is not None:
            self._cache.delete(CacheController.cache_url(url))

    # -- requests ---------------------------------------------------------------------------

    def _retrying(
        self,
        session: requests.Session,
        url: str,
        headers: Mapping[str, str] | None,
        read: Callable[[requests.Response, float], _T],
        *,
        keep_open: bool = False,
    ) -> _T:
        """``read(response, deadline)`` of a response to GET ``url``, each failure that
        may pass retried, all within ``url_budget`` seconds (``deadline``, monotonic).

        ``read`` raises `_Transient` for a body that broke off; `IndexError_` for
        an answer that retrying cannot change (404, 403, a bad page). The response
        is closed after ``read`` unless ``keep_open`` (``read`` returns it to stream).
        """
        shown = self.credentials.show(url)
        with self._failed_lock:
            earlier = self._failed.get(url)
        if earlier is not None:
            raise IndexError_(f"{earlier} (failed earlier in this run; not asked again)")
        started = time.monotonic()
        deadline = started + self.url_budget
        attempts = 0
        while True:
            self._check_cancelled(shown)
            attempts += 1
            retry_after: float | None = None
            timeout = max(0.1, min(self.timeout, deadline - time.monotonic()))
            try:
                resp = session.get(
                    url,
                    headers=dict(headers or {}),
                    auth=self.credentials.for_url(url),
                    timeout=timeout,
                    verify=self._verify,
                    stream=True,
                )
            except requests.exceptions.SSLError as e:
                if not _tls_may_pass(e):
                    raise IndexError_(f"GET {shown!r} failed: {_cause(e)}") from e
                problem = f"GET {shown!r} failed: {_cause(e)}"
            except _TRANSIENT as e:
                problem = f"GET {shown!r} failed: {_cause(e)}"
            except requests.exceptions.RequestException as e:
                raise IndexError_(f"GET {shown!r} failed: {_cause(e)}") from e
            else:
                handed_over = False
                try:
                    if resp.status_code not in RETRY_STATUSES:
                        result = read(resp, deadline)
                        handed_over = keep_open
                        return result
                    problem = _status_message(shown, resp)
                    retry_after = _retry_after(resp)
                except _Transient as e:
                    problem = f"GET {shown!r}: reading the body failed: {e}"
                finally:
                    if not handed_over:
                        resp.close()
            self._check_cancelled(shown)
            wait = (
                retry_after
                if retry_after is not None
                else self.backoff_factor * 2 ** (attempts - 1)
            )
            if attempts > self.retries or time.monotonic() + wait >= deadline:
                break
            logger.debug("%s; retrying in %.1f s", problem, wait)
            if self._cancelled.wait(wait):
                self._check_cancelled(shown)
        elapsed = time.monotonic() - started
        message = f"{problem} (after retries: {attempts} attempt(s) in {elapsed:.1f} s)"
        with self._failed_lock:
            self._failed[url] = message
        raise IndexError_(message)

    def _check_cancelled(self, shown: str) -> None:
        if self._cancelled.is_set():
            raise IndexError_(f"GET {shown!r}: interrupted")

    def _read_body(
        self, url: str, resp: requests.Response, deadline: float, max_bytes: int
    ) -> bytes:
        """The whole body, decoded, read by ``deadline`` and at most ``max_bytes`` long
        (`_body`); a body that broke off is `_Transient`, retried."""
        return b"".join(self._body(url, resp, deadline, max_bytes, self.url_budget))

    def _body(
        self,
        url: str,
        resp: requests.Response,
        deadline: float,
        max_bytes: int,
        seconds: float,
        chunk_size: int = _CHUNK,
    ) -> Iterator[bytes]:
        """The body's chunks, decoded, read by ``deadline`` (*seconds* after the start, for
        the message) and at most ``max_bytes`` long in all.

        The raw bytes are read through CacheControl (which keeps them as they came)
        and inflated here with a bound on the output, so a small compressed body
        cannot grow into gigabytes in memory. A server that keeps the connection
        alive with a byte now and then is cut off at the deadline: the socket's read
        timeout alone would wait for ever.
        """
        shown = self.credentials.show(url)
        decoder = _decoder(resp.headers.get("content-encoding", ""), shown)
        counted = not getattr(resp, "from_cache", False)
        watchdog = _Watchdog(resp, deadline)
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
                    raise _Transient(_body_cause(e)) from e
                if watchdog.fired or not chunk:
                    break
                transferred += len(chunk)
                if counted:
                    self._counters.add_bytes(len(chunk))
                if decoder is not None:
                    try:
                        chunk = decoder.decompress(chunk, max_bytes + 1 - size)
                    except zlib.error as e:
                        raise IndexError_(
                            f"GET {shown!r}: the compressed body is broken: {e}"
                        ) from e
                size += len(chunk)
                if size > max_bytes or transferred > max_bytes:
                    raise IndexError_(
                        f"GET {shown!r}: the body is larger than {max_bytes} bytes"
                        f"{' once decompressed' if decoder is not None else ''}; refusing it "
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
        if decoder is not None and not decoder.eof and transferred:
            raise _Transient("the compressed body ends early")

    def _refuse_status(self, url: str, resp: requests.Response, what: str = "") -> None:
        shown = self.credentials.show(url)
        if resp.status_code in (404, 410):
            raise HttpNotFound(f"GET {shown!r}{what}: HTTP {resp.status_code} (not found)")
        if resp.status_code >= 400:
            raise IndexError_(_status_message(shown, resp))

    def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = MAX_BODY,
    ) -> HttpResponse:
        """GET a whole resource through the cache; 404/410 raise `HttpNotFound`, other
        errors `IndexError_`, as does a body over ``max_bytes`` (decompressed)."""

        def read(resp: requests.Response, deadline: float) -> HttpResponse:
            self._refuse_status(url, resp)
            content = self._read_body(url, resp, deadline, max_bytes)
            from_cache = bool(getattr(resp, "from_cache", False))
            logger.debug(
                "GET %s -> %s (%s bytes, %s)",
                self.credentials.show(url),
                resp.status_code,
                len(content),
                "cache" if from_cache else "network",
            )
            return HttpResponse(
                url=resp.url,
                status=resp.status_code,
                headers={k.lower(): v for k, v in resp.headers.items()},
                content=content,
                from_cache=from_cache,
            )

        return self._retrying(self._session, url, headers, read)

    def _range(self, url: str, spec: str) -> tuple[bytes, int, int]:
        """One Range request; returns (body, first byte offset, total size)."""
        headers = {"Range": f"bytes={spec}", "Accept-Encoding": "identity"}
        shown = self.credentials.show(url)

        def read(resp: requests.Response, deadline: float) -> tuple[bytes, int, int]:
            self._refuse_status(url, resp, f" (Range {spec})")
            if resp.status_code == 200:
                # Closing without reading: a server that ignores Range would send the whole file.
                raise IndexError_(
                    f"GET {shown!r}: the server ignored the Range header (HTTP 200 instead of "
                    "206); refusing to download the whole file - use an index that supports "
                    "range requests or serves PEP 658 metadata"
                )
            if resp.status_code != 206:
                raise IndexError_(_status_message(shown, resp))
            match = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", "").strip())
            if match is None or match.group(3) == "*":
                raise IndexError_(
                    f"GET {shown!r}: HTTP 206 with an unusable Content-Range "
                    f"{resp.headers.get('content-range')!r}"
                )
            start, end, total = int(match.group(1)), int(match.group(2)), int(match.group(3))
            body = self._read_body(url, resp, deadline, max(0, end - start + 1))
            if len(body) != end - start + 1:
                raise IndexError_(
                    f"GET {shown!r}: Content-Range says {end - start + 1} bytes, got {len(body)}"
                )
            return body, start, total

        return self._retrying(self._range_session, url, headers, read)

    def stream(
        self,
        url: str,
        *,
        chunk_size: int = 1 << 20,
        max_bytes: int = MAX_FILE,
        seconds: float | None = None,
    ) -> Iterator[bytes]:
        """GET a whole file in chunks, past the HTTP cache (wheels are too big to keep
        twice); the status line is retried (a body that breaks off is the caller's to
        retry: it has the chunks), verified with the CA bundle and refused offline.

        The body is bounded like every other (`_body`): at most ``max_bytes`` once
        decoded (a file's known size, else `MAX_FILE`), read within ``seconds`` (default:
        the URL budget plus ``max_bytes`` at `SLOWEST_RATE`)."""
        shown = self.credentials.show(url)
        if seconds is None:
            seconds = self.url_budget + max_bytes / SLOWEST_RATE

        def opened(resp: requests.Response, _deadline: float) -> requests.Response:
            self._refuse_status(url, resp)
            if resp.status_code != 200:
                raise IndexError_(_status_message(shown, resp))
            return resp

        # a file's sha256 is over its own bytes: asked for as they are
        headers = {"Accept-Encoding": "identity"}
        resp = self._retrying(self._range_session, url, headers, opened, keep_open=True)
        with resp:
            deadline = time.monotonic() + seconds
            try:
                yield from self._body(url, resp, deadline, max_bytes, seconds, chunk_size)
            except _Transient as e:
                raise IndexError_(f"GET {shown!r}: reading the body failed: {e}") from e

    def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``start..end`` (inclusive) of ``url``, by an HTTP Range request."""
        if start < 0 or end < start:
            raise ValueError(f"bad byte range {start!r}-{end!r}")
        body, got_start, _total = self._range(url, f"{start}-{end}")
        if got_start != start:
            raise IndexError_(
                f"GET {self.credentials.show(url)!r}: asked for bytes from {start}, "
                f"got from {got_start}"
            )
        return body

    def get_tail(self, url: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes of ``url`` (fewer if it is shorter) and its total size."""
        if length <= 0:
            raise ValueError(f"bad tail length {length!r}")
        body, _start, total = self._range(url, f"-{length}")
        return body, total

    def exists(self, url: str) -> bool | None:
        """Whether ``url`` is there, by one HEAD request past the cache (remembered for the
        run): False for 404/410, True for any other answer below 400, None when the
        server cannot say (an error, a refused HEAD)."""
        if self.offline:
            return None
        with self._failed_lock:
            if url in self._exists:
                return self._exists[url]
        found: bool | None
        try:
            resp = self._range_session.head(
                url,
                auth=self.credentials.for_url(url),
                timeout=self.timeout,
                verify=self._verify,
                allow_redirects=True,
            )
            resp.close()
        except requests.exceptions.RequestException as e:
            logger.debug("HEAD %s failed: %s", self.credentials.show(url), _cause(e))
            found = None
        else:
            found = resp.status_code not in (404, 410) if resp.status_code < 500 else None
            if resp.status_code >= 400 and resp.status_code not in (404, 410):
                found = None
        with self._failed_lock:
            self._exists[url] = found
        return found

    def size(self, url: str) -> int:
        """The size of ``url`` in bytes, from a one-byte suffix range (some servers lie to HEAD)."""
        return self.get_tail(url, 1)[1]

    # -- content-addressed store ------------------------------------------------------------

    def _blob_path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return self.cache_dir / "blobs" / digest[:2] / digest

    def cache_get(self, key: str) -> bytes | None:
        """What `cache_put` stored under ``key``, or None (also when the stored bytes no
        longer match the sha256 kept beside them: a damaged entry is read again)."""
        path = self._blob_path(key)
        if path is None:
            return None
        try:
            stored = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        digest, sep, data = stored.partition(b"\n")
        if not sep or hashlib.sha256(data).hexdigest().encode() != digest:
            logger.debug("ignoring damaged cache entry %s", path)
            return None
        return data

    def cache_put(self, key: str, data: bytes) -> None:
        """Store immutable ``data`` under ``key`` with its sha256 (atomically; a no-op
        without a cache_dir; a cache that cannot be written is warned about once)."""
        path = self._blob_path(key)
        if path is None:
            return
        try:
            with atomic_writer(path) as f:
                f.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        except OSError as e:
            if not self._blobs_warned:
                self._blobs_warned = True
                logger.warning(
                    "cannot write the cache in %s (%s); going on without storing",
                    path.parent.parent,
                    e.strerror or e,
                )


class _Watchdog:
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


def _decoder(content_encoding: str, shown: str) -> Any:
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


def _cause(e: BaseException) -> str:
    while isinstance(e.__context__, BaseException) and not str(e):
        e = e.__context__
    reason = getattr(e, "reason", None) or (e.args[0] if e.args else None)
    inner = getattr(reason, "reason", None)
    return str(inner or reason or e)


def _body_cause(e: BaseException) -> str:
    """Why a body broke off, without the exception tuples urllib3 wraps it in."""
    inner = e.args[0] if e.args and isinstance(e.args[0], BaseException) else e
    if isinstance(inner, urllib3.exceptions.ProtocolError) and inner.args:
        return str(inner.args[0])
    return _cause(e)


def _status_message(shown: str, resp: requests.Response) -> str:
    return f"GET {shown!r}: HTTP {resp.status_code} {resp.reason or ''}".rstrip()


#: TLS failures that asking again cannot change: the server speaks no TLS or another
#: version of it, or its certificate does not verify
_TLS_FINAL = (
    "WRONG_VERSION_NUMBER",
    "UNSUPPORTED_PROTOCOL",
    "PROTOCOL_VERSION",
    "VERSION_TOO_LOW",
    "NO_PROTOCOLS_AVAILABLE",
    "CERTIFICATE_VERIFY_FAILED",
    "HOSTNAME MISMATCH",
    "DOESN'T MATCH",
)


def _tls_may_pass(error: requests.exceptions.SSLError) -> bool:
    """Whether a TLS failure may pass on retry (a handshake cut short may; a version or
    certificate error never does)."""
    text = str(error).upper()
    return not any(marker in text for marker in _TLS_FINAL)


def _retry_after(resp: requests.Response) -> float | None:
    """Seconds the server asks to wait (Retry-After: seconds or an HTTP date), if it asks."""
    value = resp.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
