"""The adapters under the client's sessions: the last step before the wire.

`NetworkGate` counts every request that goes to the network and refuses them
all when offline; `CachingGate` puts CacheControl in front of it, so that a
cache hit is neither counted nor refused. `Counters` are shared between the
client's adapters and its body reads, across threads, and so is `TrustStore`:
the TLS contexts that verify the indexes, each CA bundle loaded once.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from cachecontrol import CacheControlAdapter
from requests.adapters import HTTPAdapter
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3.util.ssl_ import create_urllib3_context

from envbuilder.errors import IndexError_

__all__ = ["CachingGate", "Counters", "NetworkGate", "TrustStore"]


@dataclass(kw_only=True)
class Counters:
    """Requests sent and body bytes received over the network, safe to add to from threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests_made: int = 0
    bytes_downloaded: int = 0

    def add_request(self) -> None:
        with self.lock:
            self.requests_made += 1

    def add_bytes(self, n: int) -> None:
        with self.lock:
            self.bytes_downloaded += n


class TrustStore:
    """The TLS contexts of one client, one per CA bundle (a file or a directory), each
    loaded once and shared by every connection that verifies with that bundle.

    Told a bundle's path, requests has urllib3 load it into a new context for each new
    connection: about 40 ms of CPU for the system's bundle, and a cold resolve of the
    default matrix opened 31 connections (1.34 s of its CPU went on loading bundles).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext | None] = {}

    def context(self, location: str) -> ssl.SSLContext | None:
        """The context that verifies with the bundle at ``location``; None when it cannot
        be loaded (each connection then loads it itself, and fails as it always did)."""
        with self._lock:  # the others wait for the one load rather than load it too
            if location not in self._contexts:
                self._contexts[location] = _loaded(location)
            return self._contexts[location]

    def holds(self, context: object) -> bool:
        """Whether ``context`` is one of this store's (None, a bundle that did not load,
        is not: its connections must keep the bundle's path)."""
        if context is None:
            return False
        with self._lock:
            return any(context is mine for mine in self._contexts.values())


def _loaded(location: str) -> ssl.SSLContext | None:
    # urllib3's own context for a connection that verifies (what it makes for each one),
    # with the bundle loaded as it would load it there
    try:
        context = create_urllib3_context()
        if Path(location).is_dir():
            context.load_verify_locations(capath=location)
        else:
            context.load_verify_locations(cafile=location)
    except (OSError, ValueError):  # ssl.SSLError is an OSError: a file that is no bundle
        return None
    return context


def _ca_location(url: str, verify: Any) -> str | None:
    """The CA bundle requests verifies ``url`` with (`HTTPAdapter.cert_verify`'s choice);
    None where it verifies nothing."""
    if not url.lower().startswith("https") or not verify:
        return None
    return verify if isinstance(verify, str) else DEFAULT_CA_BUNDLE_PATH


class NetworkGate(HTTPAdapter):
    """The last adapter before the wire: counts requests, refuses them when offline, and
    verifies TLS with its `TrustStore`'s contexts."""

    def __init__(
        self,
        *args: Any,
        counters: Counters,
        offline: bool,
        trust: TrustStore | None = None,
        **kwargs: Any,
    ) -> None:
        self._counters = counters
        self._offline = offline
        self._trust = trust or TrustStore()
        super().__init__(*args, **kwargs)

    def build_connection_pool_key_attributes(
        self, request: Any, verify: Any, cert: Any = None
    ) -> Any:  # requests' (host parameters, pool keywords)
        """requests' pool key, with the bundle's loaded context in place of its path."""
        host_params, keys = super().build_connection_pool_key_attributes(request, verify, cert)
        pool_kwargs: dict[str, Any] = dict(keys)
        location = _ca_location(request.url, verify)
        context = self._trust.context(location) if location is not None else None
        if context is not None:
            pool_kwargs.pop("ca_certs", None)
            pool_kwargs.pop("ca_cert_dir", None)
            pool_kwargs["ssl_context"] = context
        return host_params, pool_kwargs

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """requests' settings for ``conn``'s pool, less the bundle's path where the pool's
        context holds the bundle: with the path, each new connection loads it again."""
        super().cert_verify(conn, url, verify, cert)  # type: ignore[no-untyped-call]
        pool_context = getattr(conn, "conn_kw", {}).get("ssl_context")  # urllib3's pool
        if _ca_location(url, verify) is not None and self._trust.holds(pool_context):
            conn.ca_certs = None
            conn.ca_cert_dir = None

    def send(self, request: Any, *args: Any, **kwargs: Any) -> requests.Response:
        if self._offline:
            raise IndexError_(
                f"offline: {request.url!r} is not in the cache; run once online to fill it"
            )
        self._counters.add_request()
        return super().send(request, *args, **kwargs)


class CachingGate(CacheControlAdapter, NetworkGate):
    """`NetworkGate` behind CacheControl: what the cache answers never reaches the gate."""
