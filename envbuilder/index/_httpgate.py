"""The adapters under the client's sessions: the last step before the wire.

`NetworkGate` counts every request that goes to the network and refuses them
all when offline; `CachingGate` puts CacheControl in front of it, so that a
cache hit is neither counted nor refused. `Counters` are shared between the
client's adapters and its body reads, across threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import requests
from cachecontrol import CacheControlAdapter
from requests.adapters import HTTPAdapter

from envbuilder.errors import IndexError_

__all__ = ["CachingGate", "Counters", "NetworkGate"]


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


class NetworkGate(HTTPAdapter):
    """The last adapter before the wire: counts requests, refuses them when offline."""

    def __init__(self, *args: Any, counters: Counters, offline: bool, **kwargs: Any) -> None:
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


class CachingGate(CacheControlAdapter, NetworkGate):
    """`NetworkGate` behind CacheControl: what the cache answers never reaches the gate."""
