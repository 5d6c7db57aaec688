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

`HttpClient` is the one door, and this module the one place other modules
import from. Its parts each have a module of their own: the retry and timeout
policy (`envbuilder.index._httpretry`), what a failure is and how it is worded
(`_httpfailures`), the bounded body (`_httpbody`), the HTTP cache's rules
(`_httpcache`), the adapters before the wire (`_httpgate`) and the
content-addressed store (`_blobstore`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests
from cachecontrol.caches import FileCache
from cachecontrol.controller import CacheController
from requests.adapters import HTTPAdapter

from envbuilder import __version__
from envbuilder.credentials import Credentials
from envbuilder.errors import HttpNotFound, IndexError_
from envbuilder.index._blobstore import BlobStore
from envbuilder.index._httpbody import CHUNK, MAX_BODY, MAX_FILE, SLOWEST_RATE, bounded_chunks
from envbuilder.index._httpcache import (
    SECRET_HEADERS,
    Controller,
    KeepUnvalidated,
    OfflineController,
    TolerantFileCache,
    fresh_until,
)
from envbuilder.index._httpfailures import (
    TRANSIENT_ERRORS,
    Transient,
    cause,
    status_message,
    tls_may_pass,
)
from envbuilder.index._httpgate import CachingGate, Counters, NetworkGate, TrustStore
from envbuilder.index._httpretry import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL_BUDGET,
    RETRY_STATUSES,
    backoff,
    retry_after,
)

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

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_T = TypeVar("_T")


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


#: requests the relay makes for uv at once (`envbuilder.index.relay.UPSTREAM_CONNECTIONS`)
RELAY_CONNECTIONS = 16


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
        self._counters = Counters()
        self._verify: bool | str = ca_bundle if ca_bundle else True
        self._failed: dict[str, str] = {}
        self._pages: dict[str, float | None] = {}
        self._exists: dict[str, bool | None] = {}
        self._failed_lock = threading.Lock()
        self._cancelled = threading.Event()
        # connections kept per host: the deciding threads and the relay's upstream fetches
        # for uv (16) share them; a smaller pool discards connections mid-run (a warning
        # each, and a new TLS handshake for the next request)
        pool = max_workers + RELAY_CONNECTIONS
        gate_kwargs: dict[str, Any] = {
            "counters": self._counters,
            "trust": TrustStore(),  # both sessions' connections load each CA bundle once
            "offline": offline,
            "max_retries": 0,  # retried here, body reads included, under one time budget
            "pool_connections": pool,
            "pool_maxsize": pool,
        }
        self._session = requests.Session()
        self._session.headers["User-Agent"] = f"envbuilder/{__version__}"
        # Only the encodings `bounded_chunks` decodes itself, bounded (not brotli or zstd).
        self._session.headers["Accept-Encoding"] = "gzip, deflate"
        self._cache: FileCache | None = None
        self._blobs = BlobStore(cache_dir)
        if cache_dir is not None:
            self._cache = TolerantFileCache(str(cache_dir / "http"))
            adapter: HTTPAdapter = CachingGate(
                cache=self._cache,
                heuristic=KeepUnvalidated(page_ttl),
                controller_class=OfflineController if offline else Controller,
                **gate_kwargs,
            )
        else:
            adapter = NetworkGate(**gate_kwargs)
        # Range reads bypass the HTTP cache: a cached full body must never answer a Range.
        self._range_adapter = NetworkGate(**gate_kwargs)
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

        ``read`` raises `Transient` for a body that broke off; `IndexError_` for
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
            waited: float | None = None
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
                if not tls_may_pass(e):
                    raise IndexError_(f"GET {shown!r} failed: {cause(e)}") from e
                problem = f"GET {shown!r} failed: {cause(e)}"
            except TRANSIENT_ERRORS as e:
                problem = f"GET {shown!r} failed: {cause(e)}"
            except requests.exceptions.RequestException as e:
                raise IndexError_(f"GET {shown!r} failed: {cause(e)}") from e
            else:
                handed_over = False
                try:
                    if resp.status_code not in RETRY_STATUSES:
                        result = read(resp, deadline)
                        handed_over = keep_open
                        return result
                    problem = status_message(shown, resp)
                    waited = retry_after(resp)
                except Transient as e:
                    problem = f"GET {shown!r}: reading the body failed: {e}"
                finally:
                    if not handed_over:
                        resp.close()
            self._check_cancelled(shown)
            wait = waited if waited is not None else backoff(self.backoff_factor, attempts)
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
        (`_body`); a body that broke off is `Transient`, retried."""
        return b"".join(self._body(url, resp, deadline, max_bytes, self.url_budget))

    def _body(
        self,
        url: str,
        resp: requests.Response,
        deadline: float,
        max_bytes: int,
        seconds: float,
        chunk_size: int = CHUNK,
    ) -> Iterator[bytes]:
        """The body's chunks, bounded in bytes and time (`bounded_chunks`), its network
        bytes counted in `bytes_downloaded`."""
        return bounded_chunks(
            resp,
            shown=self.credentials.show(url),
            deadline=deadline,
            max_bytes=max_bytes,
            seconds=seconds,
            count=self._counters.add_bytes,
            chunk_size=chunk_size,
        )

    def _refuse_status(self, url: str, resp: requests.Response, what: str = "") -> None:
        shown = self.credentials.show(url)
        if resp.status_code in (404, 410):
            raise HttpNotFound(f"GET {shown!r}{what}: HTTP {resp.status_code} (not found)")
        if resp.status_code >= 400:
            raise IndexError_(status_message(shown, resp))

    def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = MAX_BODY,
        immutable: bool = False,
    ) -> HttpResponse:
        """GET a whole resource through the cache; 404/410 raise `HttpNotFound`, other
        errors `IndexError_`, as does a body over ``max_bytes`` (decompressed).

        ``immutable``: the resource cannot change (a wheel's ``.metadata``: the wheel is
        named by its hash), so `pages_read` does not list it."""

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
            lower = {k.lower(): v for k, v in resp.headers.items()}
            if not immutable:
                with self._failed_lock:
                    self._pages[url] = fresh_until(lower)
            return HttpResponse(
                url=resp.url, status=resp.status_code, headers=lower, content=content,
                from_cache=from_cache,
            )  # fmt: skip

        try:
            return self._retrying(self._session, url, headers, read)
        except IndexError_:  # a 404 or an error: not kept by the cache, asked again next run
            with self._failed_lock:
                self._pages[url] = None
            raise

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
                raise IndexError_(status_message(shown, resp))
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
                raise IndexError_(status_message(shown, resp))
            return resp

        # a file's sha256 is over its own bytes: asked for as they are
        headers = {"Accept-Encoding": "identity"}
        resp = self._retrying(self._range_session, url, headers, opened, keep_open=True)
        with resp:
            deadline = time.monotonic() + seconds
            try:
                yield from self._body(url, resp, deadline, max_bytes, seconds, chunk_size)
            except Transient as e:
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
            logger.debug("HEAD %s failed: %s", self.credentials.show(url), cause(e))
            found = None
        else:
            found = resp.status_code not in (404, 410) if resp.status_code < 500 else None
            if resp.status_code >= 400 and resp.status_code not in (404, 410):
                found = None
        with self._failed_lock:
            self._exists[url] = found
            self._pages[f"HEAD {url}"] = None  # past the cache: asked again next run
        return found

    def size(self, url: str) -> int:
        """The size of ``url`` in bytes, from a one-byte suffix range (some servers lie to HEAD)."""
        return self.get_tail(url, 1)[1]

    def pages_read(self) -> dict[str, float | None]:
        """Every URL `get` and `exists` answered in this run, with until when the cache
        serves its answer without asking again (`fresh_until`; None: it asks every time,
        as for a 404, an error or a HEAD)."""
        with self._failed_lock:
            return dict(self._pages)

    def cache_entry(self, url: str) -> tuple[int, int] | None:
        """The size and modification time (ns) of the HTTP cache's file for ``url``, or
        None where none is kept: a change of either means its answer changed."""
        if self._cache is None:
            return None
        try:
            st = Path(self._cache._fn(CacheController.cache_url(url))).stat()
        except (OSError, AttributeError):
            return None
        return st.st_size, st.st_mtime_ns

    # -- content-addressed store ------------------------------------------------------------

    def cache_get(self, key: str) -> bytes | None:
        """What `cache_put` stored under ``key``, or None (also when the stored bytes no
        longer match the sha256 kept beside them: a damaged entry is read again)."""
        return self._blobs.get(key)

    def cache_put(self, key: str, data: bytes) -> None:
        """Store immutable ``data`` under ``key`` with its sha256 (atomically; a no-op
        without a cache_dir; a cache that cannot be written is warned about once)."""
        self._blobs.put(key, data)
