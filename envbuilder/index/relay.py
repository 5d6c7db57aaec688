"""A loopback Simple API through which the uv processes of one run read their indexes.

A run locks many closures at once, one ``uv pip compile`` each, and most of
them need the same pages (numpy, sympy, the ``nvidia-*`` runtimes) and the
same core metadata: asked of the index directly, every process fetches every
one of them again, and an index that sends no validators answers each time in
full. Through the relay each page and each ``.metadata`` file is fetched once
per run, through envbuilder's `HttpClient` (its HTTP cache, its bounds, its
retries, the pages the decisions already read: in the cache on disk where the relay
runs in a process of its own, `envbuilder.index.relayproc`), and the processes read it
from loopback.

The relay serves PEP 691 JSON pages with each file's URL pointing back at
the relay, so that uv asks it for the ``<file>.metadata`` too. A wheel whose
index does not advertise its core metadata (a mirror that strips the key) is
advertised anyway: the relay reads ``METADATA`` out of the wheel by range
requests, once, into envbuilder's cache (keyed by the wheel's sha256), instead
of every uv process reading it by ranges again. Anything else under a file's
URL (the file itself) is redirected to the index's own URL, and so is a page
the index answers in HTML (uv reads those as before). `restore` turns the relay's
URLs in uv's answer back into the index's. The address holds a random token:
another user of the machine cannot read the pages through it.

Given the platform tags of the run's targets, the relay leaves out of each page the
wheels that none of them accepts. A universal closure would otherwise list every
platform's wheels, which envbuilder then reads and drops: uv's 18 answers for the
default matrix came to 2.2 MB with 6,416 wheels, now 0.5 MB with 1,015. A release
none of whose wheels fits keeps them all, so that uv sees the same releases and
selection's own error names a package that has nothing for a target.

Given the run's Pythons, the relay also fetches ahead of uv (`lookahead`): the pages a
fetched metadata file requires, and the metadata of the release each page likely gives
each Python, so that uv's next level is fetched while it reads this one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from packaging.specifiers import SpecifierSet

from envbuilder.errors import EnvbuilderError, HttpNotFound
from envbuilder.index.http import RELAY_CONNECTIONS, HttpClient
from envbuilder.index.lookahead import likely_wheels, pythons_of, required
from envbuilder.index.remotewheel import metadata_member_name, read_member
from envbuilder.index.simple import (
    ACCEPT,
    JSON_TYPE,
    DistributionFile,
    project_url,
    wheel_platforms,
)

__all__ = ["IndexRelay", "UvRelay", "fitting"]

logger = logging.getLogger(__name__)

#: Requests the relay sends to the indexes at once, whatever the number of uv processes.
UPSTREAM_CONNECTIONS = RELAY_CONNECTIONS
#: Of those, how many may be the relay's own guesses (`lookahead`) rather than uv's requests.
LOOKAHEAD_FETCHES = UPSTREAM_CONNECTIONS // 2
#: Requests one uv process may send the relay at once. They reach loopback, not the index
#: (the relay bounds what goes upstream), so more of them only shorten uv's waits: one
#: pairing's cold resolve took 3.4-3.6 s with 16 against 4.6-4.9 s with 2.
UV_DOWNLOADS = 16


class UvRelay(Protocol):
    """What a run's uv processes need of a relay: `IndexRelay`, or the same served from a
    process of its own (`envbuilder.index.relayproc.RelayProcess`)."""

    def index_url(self, upstream: str) -> str:
        """The relay's address for the Simple API index at ``upstream``."""
        ...

    def restore(self, text: str) -> str:
        """``text`` with every relay URL turned back into the index's own."""
        ...


@dataclass(frozen=True, kw_only=True)
class _Answer:
    status: int
    body: bytes = b""
    content_type: str = "application/octet-stream"
    location: str | None = None


@dataclass(frozen=True, kw_only=True)
class _File:
    """A file of a relayed page: its URL on the index and its page entry as the index wrote it."""

    url: str
    filename: str
    entry: dict[str, Any]


_PLAIN = re.compile(r"[A-Za-z0-9._+\-]+")


def _quoted(filename: str) -> str:
    """``filename`` as a path segment (wheel names need no quoting; others may)."""
    return filename if _PLAIN.fullmatch(filename) else urllib.parse.quote(filename)


def fitting(files: list[Any], platforms: Collection[str]) -> list[Any]:
    """A PEP 691 page's *files* less the wheels whose platform tags are none of
    *platforms*, except in a release where no wheel fits (it keeps them all)."""
    fits: list[bool | None] = []  # None: not a wheel (an sdist, something unknown)
    releases: list[str | None] = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.endswith(".whl") or name.count("-") < 4:
            fits.append(None)
            releases.append(None)
            continue
        fits.append(not set(wheel_platforms(name)).isdisjoint(platforms))
        releases.append(name.split("-", 2)[1])
    fitting_releases = {r for r, fit in zip(releases, fits, strict=True) if fit}
    return [
        entry
        for entry, fit, release in zip(files, fits, releases, strict=True)
        if fit is not False or release not in fitting_releases
    ]


def _advertised(entry: dict[str, Any]) -> bool:
    """Whether a PEP 691 entry advertises its core metadata (PEP 658/714)."""
    return bool(entry.get("core-metadata", entry.get("data-dist-info-metadata", False)))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: uv sends many requests on few connections

    def do_GET(self) -> None:  # the name http.server calls
        self._answer(self.server.relay._route(self.path), body=True)

    def do_HEAD(self) -> None:
        self._answer(self.server.relay._route(self.path), body=False)

    def _answer(self, answer: _Answer, *, body: bool) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        self.send_header("Cache-Control", "no-store")  # the address lives for one run
        if answer.location is not None:
            self.send_header("Location", answer.location)
        self.end_headers()
        if body:
            self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("relay: %s", format % args)


#: seconds between the relay's checks for `shutdown` (the standard library's 0.5 s cost every
#: run a quarter of a second on average at its end)
SHUTDOWN_POLL_S = 0.02


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # uv processes connecting at once (up to `UV_DOWNLOADS` each): the standard library's
    # backlog of 5 drops the rest, and each dropped connection waits a second to retry
    request_queue_size = 1024
    relay: IndexRelay


class IndexRelay:
    """``with IndexRelay(client) as relay:`` hand uv ``relay.index_url(url)`` and read its
    answer through ``relay.restore(text)``."""

    def __init__(
        self,
        client: HttpClient,
        *,
        platforms: Collection[str] | None = None,
        pythons: Collection[str] = (),
    ) -> None:
        self.client = client
        #: the platform tags of the run's targets: other wheels are left out (`fitting`)
        self._platforms = None if platforms is None else frozenset(platforms)
        #: the run's Python versions: with any, the relay fetches ahead of uv (`lookahead`)
        self._pythons = pythons_of(pythons)
        self._ahead = (
            ThreadPoolExecutor(LOOKAHEAD_FETCHES, thread_name_prefix="relay-ahead")
            if self._pythons
            else None
        )
        self._listed: dict[str, dict[str, _File]] = {}  # page URL -> its wheels by name
        self._wanted: set[tuple[str, str]] = set()  # (page URL, specifier) looked at
        self._token = secrets.token_urlsafe(16)
        self._lock = threading.Lock()
        self._indexes: list[str] = []
        self._files: list[_File] = []
        self._file_ids: dict[str, int] = {}
        self._fetches: dict[tuple[str, str], Future[_Answer]] = {}
        self._upstream = threading.BoundedSemaphore(UPSTREAM_CONNECTIONS)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.relay = self
        # a short poll: `shutdown` waits for the loop's next turn, at the end of every run
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="index-relay",
            daemon=True,
        )
        host, port = self._server.server_address[:2]
        self._base = f"http://{host!s}:{port}/{self._token}"
        self._relayed = re.compile(re.escape(self._base) + r"/(i|f)/(\d+)/[^\s\"'<>]*")

    def __enter__(self) -> IndexRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ahead is not None:
            self._ahead.shutdown(wait=False, cancel_futures=True)
        self._server.shutdown()
        self._server.server_close()

    def index_url(self, upstream: str) -> str:
        """The relay's address for the Simple API index at ``upstream`` (http or https)."""
        with self._lock:
            if upstream not in self._indexes:
                self._indexes.append(upstream)
            return f"{self._base}/i/{self._indexes.index(upstream)}/"

    def restore(self, text: str) -> str:
        """``text`` (uv's lock or its message) with every relay URL turned back into the
        index's own: a file's URL, or an index's (``/i/<n>/...``, the rest kept)."""

        def original(m: re.Match[str]) -> str:
            kind, number = m.group(1), int(m.group(2))
            with self._lock:
                if kind == "f" and number < len(self._files):
                    return self._files[number].url
                if kind == "i" and number < len(self._indexes):
                    rest = m.group(0)[len(f"{self._base}/i/{number}/") :]
                    return self._indexes[number].rstrip("/") + "/" + rest
            return m.group(0)

        return self._relayed.sub(original, text)

    # -- serving ----------------------------------------------------------------------------

    def _route(self, path: str) -> _Answer:
        parts = urllib.parse.urlsplit(path).path.split("/")
        # ['', token, 'i', n, project, ''] or ['', token, 'f', n, filename...]
        if len(parts) < 5 or not secrets.compare_digest(parts[1], self._token):
            return _Answer(status=404)
        kind, number = parts[2], parts[3]
        if not number.isdigit():
            return _Answer(status=404)
        n = int(number)
        with self._lock:
            index = self._indexes[n] if kind == "i" and n < len(self._indexes) else None
            file = self._files[n] if kind == "f" and n < len(self._files) else None
        if index is not None:
            url = project_url(index, urllib.parse.unquote(parts[4]))
            answer = self._once(("page", url), lambda: self._page(url))
            self._look_ahead(self._releases, url, SpecifierSet())
            return answer
        if file is None:
            return _Answer(status=404)
        if urllib.parse.unquote(parts[-1]) == f"{file.filename}.metadata":
            return self._file_metadata(file)
        return _Answer(status=302, location=file.url)  # the file itself: from the index

    def _once(self, key: tuple[str, str], fetch: Callable[[], _Answer]) -> _Answer:
        """``fetch()``'s answer, computed once per run however many processes ask."""
        with self._lock:
            future = self._fetches.get(key)
            owner = future is None
            if future is None:
                future = self._fetches[key] = Future()
        if owner:
            try:
                with self._upstream:
                    future.set_result(fetch())
            except BaseException as e:
                future.set_exception(e)
                raise
        return future.result()

    # -- fetching ahead of uv (`lookahead`) ------------------------------------------------

    def _look_ahead(
        self, step: Callable[[str, SpecifierSet], None], url: str, spec: SpecifierSet
    ) -> None:
        """Run ``step(url, spec)`` on a lookahead thread, once per page and specifier."""
        if self._ahead is None:
            return
        with self._lock:
            if (url, str(spec)) in self._wanted:
                return
            self._wanted.add((url, str(spec)))
        self._submit(lambda: step(url, spec), url)

    def _submit(self, work: Callable[[], object], what: str) -> None:
        """``work()`` on a lookahead thread; its failure only costs the guess."""
        if self._ahead is None:
            return

        def guarded() -> None:
            try:
                work()
            except Exception as e:  # uv asks for itself and gets the index's own answer
                logger.debug("relay lookahead %s: %s", what, e)

        with contextlib.suppress(RuntimeError):  # shut down: the run is over
            self._ahead.submit(guarded)

    def _releases(self, url: str, spec: SpecifierSet) -> None:
        """Fetch the page at ``url``, then (each on a thread of its own) the metadata of
        the wheels uv will likely read from it for ``spec``."""
        self._once(("page", url), lambda: self._page(url))
        with self._lock:
            wheels = self._listed.get(url, {})
        entries = [file.entry for file in wheels.values()]
        for entry in likely_wheels(entries, specifier=spec, pythons=self._pythons):
            file = wheels[entry["filename"]]
            self._submit(functools.partial(self._file_metadata, file), file.url)

    def _file_metadata(self, file: _File) -> _Answer:
        """The wheel's metadata, fetched once per run; the pages it requires are wanted."""
        return self._once(("metadata", file.url), lambda: self._followed(self._metadata(file)))

    def _followed(self, answer: _Answer) -> _Answer:
        """``answer`` (a wheel's metadata), with the pages it requires wanted ahead of uv."""
        if self._ahead is None or answer.status != 200:
            return answer
        with self._lock:
            indexes = list(self._indexes)
        for name, spec in required(answer.body):
            for index in indexes:
                self._look_ahead(self._releases, project_url(index, name), spec)
        return answer

    def _get(
        self, url: str, accept: str | None, *, immutable: bool = False
    ) -> tuple[_Answer | None, Any]:
        headers = {"Accept": accept} if accept else None
        try:
            return None, self.client.get(url, headers=headers, immutable=immutable)
        except HttpNotFound:
            return _Answer(status=404), None
        except EnvbuilderError as e:  # an index's failure, or a URL the client refuses
            logger.debug("relay: %s", e)
            return _Answer(status=502, body=str(e).encode(), content_type="text/plain"), None

    def _page(self, url: str) -> _Answer:
        failed, response = self._get(url, ACCEPT)
        if failed is not None:
            return failed
        if response.content_type != JSON_TYPE:
            return _Answer(status=302, location=response.url)  # HTML: uv reads it as before
        try:
            page = json.loads(response.content)
            if self._platforms is not None:
                page["files"] = fitting(page["files"], self._platforms)
            wheels = {}
            for entry in page["files"]:
                relayed = self._relay_file(entry, response.url)
                if relayed.filename.endswith(".whl"):
                    wheels[relayed.filename] = relayed
            if self._ahead is not None:  # what `_releases` picks from
                with self._lock:
                    self._listed[url] = wheels
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return _Answer(status=302, location=response.url)  # uv's own error for it
        body = json.dumps(page, ensure_ascii=False).encode("utf-8")
        return _Answer(status=200, body=body, content_type=JSON_TYPE)

    def _relay_file(self, entry: dict[str, Any], page_url: str) -> _File:
        """Point one PEP 691 file entry at the relay; a wheel's metadata is advertised."""
        original = entry["url"]
        if not original.startswith(("https://", "http://")):  # PEP 691: relative to the page
            original = urllib.parse.urljoin(page_url, original)
        filename = entry["filename"]
        with self._lock:
            number = self._file_ids.get(original)
            if number is None:
                number = self._file_ids[original] = len(self._files)
                self._files.append(_File(url=original, filename=filename, entry=dict(entry)))
            relayed = self._files[number]
        entry["url"] = f"{self._base}/f/{number}/{_quoted(filename)}"
        if filename.endswith(".whl") and not _advertised(entry):
            entry["core-metadata"] = True
        return relayed

    def _metadata(self, relayed: _File) -> _Answer:
        """The wheel's core metadata: the index's ``.metadata`` where it advertises one,
        else ``METADATA`` read out of the wheel by ranges (envbuilder's cache keeps it)."""
        entry = relayed.entry
        if _advertised(entry):
            # a wheel's metadata: the wheel is named by its hash in the page, so it cannot change
            metadata = relayed.url.split("#", 1)[0] + ".metadata"
            failed, response = self._get(metadata, None, immutable=True)
            return failed or _Answer(status=200, body=response.content)
        hashes, size = entry.get("hashes"), entry.get("size")
        file = DistributionFile(
            filename=relayed.filename,
            url=relayed.url,
            hashes=dict(hashes) if isinstance(hashes, dict) else {},
            size=size if isinstance(size, int) else None,
        )
        try:
            data = read_member(self.client, file, metadata_member_name(file.filename))
        except (EnvbuilderError, ValueError) as e:
            logger.debug("relay: %s", e)
            return _Answer(status=404)
        return _Answer(status=404) if data is None else _Answer(status=200, body=data)
