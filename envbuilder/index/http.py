"""HTTP for package indexes: caching, retries, range reads, offline mode, byte counts.

Whole responses (index pages, ``.metadata`` files) go through CacheControl
with a ``FileCache`` under ``<cache_dir>/http``: they are revalidated with
ETag / Last-Modified, and a response that carries neither validators nor a
freshness lifetime is kept for ``page_ttl`` seconds so that ``offline`` runs
have something to serve. Range responses (206) are never cached by
CacheControl; callers keep what they derive from them in the small
content-addressed store (``cache_get`` / ``cache_put``), keyed by the file's
sha256 where known - files on an index are immutable.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from cachecontrol import CacheControlAdapter
from cachecontrol.caches import FileCache
from cachecontrol.controller import CacheController
from cachecontrol.heuristics import BaseHeuristic
from requests.adapters import HTTPAdapter
from urllib3 import HTTPResponse
from urllib3.util.retry import Retry

from envbuilder import __version__
from envbuilder.credentials import Credentials
from envbuilder.errors import IndexError_
from envbuilder.files import atomic_writer

__all__ = [
    "RETRY_STATUSES",
    "HttpClient",
    "HttpNotFound",
    "HttpResponse",
]

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class HttpNotFound(IndexError_):
    """The server answered 404 or 410: the resource does not exist."""


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


class _OfflineController(CacheController):
    """Serve whatever is cached, however stale: there is no network to revalidate with."""

    def cached_request(self, request: Any) -> Any:
        cached = self._load_from_cache(request)
        return cached if cached is not None else False


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
    """One HTTP session for every index request of a run; safe to share between threads."""

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        offline: bool = False,
        ca_bundle: str | None = None,
        retries: int = 4,
        timeout: float = 30,
        backoff_factor: float = 0.5,
        page_ttl: int = 600,
        max_workers: int = 8,
        credentials: Credentials | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        self.credentials = credentials or Credentials()
        self.offline = offline
        self.timeout = timeout
        self.max_workers = max_workers
        self._counters = _Counters()
        self._verify: bool | str = ca_bundle if ca_bundle else True
        retry = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            backoff_factor=backoff_factor,
            status_forcelist=sorted(RETRY_STATUSES),
            allowed_methods=frozenset({"GET", "HEAD"}),
            respect_retry_after_header=True,
            raise_on_status=False,
        )
        pool = max(10, max_workers)
        gate_kwargs: dict[str, Any] = {
            "counters": self._counters,
            "offline": offline,
            "max_retries": retry,
            "pool_connections": pool,
            "pool_maxsize": pool,
        }
        self._session = requests.Session()
        self._session.headers["User-Agent"] = f"envbuilder/{__version__}"
        if cache_dir is not None:
            adapter: HTTPAdapter = _CachingGate(
                cache=FileCache(str(cache_dir / "http")),
                heuristic=_KeepUnvalidated(page_ttl),
                controller_class=_OfflineController if offline else None,
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
        """Requests sent over the network (cache hits not included; retries count once)."""
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

    # -- requests ---------------------------------------------------------------------------

    def _send(
        self, session: requests.Session, url: str, headers: Mapping[str, str] | None
    ) -> requests.Response:
        try:
            return session.get(
                url,
                headers=dict(headers or {}),
                auth=self.credentials.for_url(url),
                timeout=self.timeout,
                verify=self._verify,
                stream=True,
            )
        except requests.exceptions.RetryError as e:
            raise IndexError_(
                f"GET {self.credentials.show(url)!r} failed after retries: {_cause(e)}"
            ) from e
        except requests.exceptions.RequestException as e:
            raise IndexError_(f"GET {self.credentials.show(url)!r} failed: {_cause(e)}") from e

    def _read_body(self, resp: requests.Response) -> bytes:
        try:
            content = resp.content
        except requests.exceptions.RequestException as e:
            raise IndexError_(
                f"GET {self.credentials.show(resp.url)!r}: reading the body failed: {_cause(e)}"
            ) from e
        if not getattr(resp, "from_cache", False):
            tell = getattr(resp.raw, "tell", None)
            transferred = int(tell()) if callable(tell) else 0
            self._counters.add_bytes(transferred or len(content))
        return content

    def get(self, url: str, *, headers: Mapping[str, str] | None = None) -> HttpResponse:
        """GET a whole resource through the cache; 404/410 raise `HttpNotFound`, other errors `IndexError_`."""
        resp = self._send(self._session, url, headers)
        with resp:
            if resp.status_code in (404, 410):
                raise HttpNotFound(
                    f"GET {self.credentials.show(url)!r}: HTTP {resp.status_code} (not found)"
                )
            if resp.status_code >= 400:
                raise IndexError_(
                    _status_message(
                        self.credentials.show(url),
                        resp,
                        retried=resp.status_code in RETRY_STATUSES,
                    )
                )
            content = self._read_body(resp)
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

    def _range(self, url: str, spec: str) -> tuple[bytes, int, int]:
        """One Range request; returns (body, first byte offset, total size)."""
        headers = {"Range": f"bytes={spec}", "Accept-Encoding": "identity"}
        resp = self._send(self._range_session, url, headers)
        with resp:
            if resp.status_code in (404, 410):
                raise HttpNotFound(
                    f"GET {self.credentials.show(url)!r} (Range {spec}): HTTP {resp.status_code} (not found)"
                )
            if resp.status_code == 200:
                # Closing without reading: a server that ignores Range would send the whole file.
                raise IndexError_(
                    f"GET {self.credentials.show(url)!r}: the server ignored the Range header (HTTP 200 instead of 206); "
                    "refusing to download the whole file - use an index that supports range "
                    "requests or serves PEP 658 metadata"
                )
            if resp.status_code != 206:
                raise IndexError_(
                    _status_message(
                        self.credentials.show(url),
                        resp,
                        retried=resp.status_code in RETRY_STATUSES,
                    )
                )
            match = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", "").strip())
            if match is None or match.group(3) == "*":
                raise IndexError_(
                    f"GET {self.credentials.show(url)!r}: HTTP 206 with an unusable Content-Range "
                    f"{resp.headers.get('content-range')!r}"
                )
            body = self._read_body(resp)
            start, end, total = int(match.group(1)), int(match.group(2)), int(match.group(3))
            if len(body) != end - start + 1:
                raise IndexError_(
                    f"GET {self.credentials.show(url)!r}: Content-Range says {end - start + 1} bytes, got {len(body)}"
                )
            return body, start, total

    def stream(self, url: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """GET a whole file in chunks, past the HTTP cache (wheels are too big to keep
        twice); retried, verified with the CA bundle and refused offline like every request."""
        resp = self._send(self._range_session, url, None)
        with resp:
            if resp.status_code in (404, 410):
                raise HttpNotFound(
                    f"GET {self.credentials.show(url)!r}: HTTP {resp.status_code} (not found)"
                )
            if resp.status_code != 200:
                raise IndexError_(
                    _status_message(
                        self.credentials.show(url),
                        resp,
                        retried=resp.status_code in RETRY_STATUSES,
                    )
                )
            try:
                for chunk in resp.iter_content(chunk_size):
                    self._counters.add_bytes(len(chunk))
                    yield chunk
            except requests.exceptions.RequestException as e:
                raise IndexError_(
                    f"GET {self.credentials.show(url)!r}: reading the body failed: {_cause(e)}"
                ) from e

    def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``start..end`` (inclusive) of ``url``, by an HTTP Range request."""
        if start < 0 or end < start:
            raise ValueError(f"bad byte range {start!r}-{end!r}")
        body, got_start, _total = self._range(url, f"{start}-{end}")
        if got_start != start:
            raise IndexError_(
                f"GET {self.credentials.show(url)!r}: asked for bytes from {start}, got from {got_start}"
            )
        return body

    def get_tail(self, url: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes of ``url`` (fewer if it is shorter) and its total size."""
        if length <= 0:
            raise ValueError(f"bad tail length {length!r}")
        body, _start, total = self._range(url, f"-{length}")
        return body, total

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
        """What `cache_put` stored under ``key``, or None."""
        path = self._blob_path(key)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def cache_put(self, key: str, data: bytes) -> None:
        """Store immutable ``data`` under ``key`` (atomically; a no-op without a cache_dir)."""
        path = self._blob_path(key)
        if path is None:
            return
        with atomic_writer(path) as f:
            f.write(data)


def _cause(e: BaseException) -> str:
    while isinstance(e.__context__, BaseException) and not str(e):
        e = e.__context__
    reason = getattr(e, "reason", None) or (e.args[0] if e.args else None)
    inner = getattr(reason, "reason", None)
    return str(inner or reason or e)


def _status_message(url: str, resp: requests.Response, *, retried: bool) -> str:
    after = " (after retries)" if retried else ""
    return f"GET {url!r}: HTTP {resp.status_code} {resp.reason or ''}{after}".rstrip()
