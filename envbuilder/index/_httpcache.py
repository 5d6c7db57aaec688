"""The HTTP cache's rules: what CacheControl keeps, and what it serves offline.

Whole responses (index pages, ``.metadata`` files) are kept in a `FileCache`
and revalidated with ETag / Last-Modified; a response that carries neither
validators nor a freshness lifetime is kept for a while (`KeepUnvalidated`)
so that offline runs have something to serve (`OfflineController`, however
stale). A response that varies on a header carrying a secret (``Vary:
Authorization``) is never written (`Controller`): CacheControl would store the
request's header beside it. A cache directory that cannot be written is
read, warned about once, and not written (`TolerantFileCache`).
"""

from __future__ import annotations

import datetime
import email.utils
import logging
from collections.abc import Mapping
from typing import Any

from cachecontrol.caches import FileCache
from cachecontrol.controller import CacheController
from cachecontrol.heuristics import BaseHeuristic
from urllib3 import HTTPResponse

__all__ = [
    "SECRET_HEADERS",
    "Controller",
    "KeepUnvalidated",
    "OfflineController",
    "TolerantFileCache",
    "fresh_until",
]

logger = logging.getLogger(__name__)

#: Request headers that carry a secret: a response that varies on one is not cached.
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def fresh_until(headers: Mapping[str, str]) -> float | None:
    """Until when (seconds since the epoch) the cache serves a response with these
    (lower-case) headers without asking again: its ``Date`` plus ``max-age`` less its
    ``Age``, else its ``Expires``; None where it must be revalidated or says nothing."""
    control = [d.strip().lower() for d in headers.get("cache-control", "").split(",")]
    if any(d in ("no-cache", "no-store") for d in control):
        return None
    date = _http_date(headers.get("date"))
    for directive in control:
        name, _, value = directive.partition("=")
        if name == "max-age" and value.strip().isdigit() and date is not None:
            age = headers.get("age", "0").strip()
            return date + int(value) - (int(age) if age.isdigit() else 0)
    return _http_date(headers.get("expires"))


def _http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()


class KeepUnvalidated(BaseHeuristic):
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


class Controller(CacheController):
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


class OfflineController(Controller):
    """Serve whatever is cached, however stale: there is no network to revalidate with."""

    def cached_request(self, request: Any) -> Any:
        cached = self._load_from_cache(request)
        return cached if cached is not None else False


class TolerantFileCache(FileCache):
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
