"""A Simple API index on loopback, serving real wheels, for integration tests.

    server = IndexServer()
    server.add_index("simple", {"xformers": [IndexedFile(wheel=w)]})
    server.add_index("whl/cu121", {"torch": [IndexedFile(wheel=t)]})  # PyTorch-style layout
    with server:
        page_url = server.index_url("simple")       # http://127.0.0.1:PORT/simple
        ...
    server.stats.requests, server.stats.bytes_sent, server.stats.log

Behaviour switches are plain attributes that tests may change between
requests: ``format`` ("auto" negotiates by Accept; "json" / "html" force
one), ``advertise_metadata`` (PEP 658/714 keys on the page),
``serve_metadata`` (the ``<file>.metadata`` resources exist),
``ranges`` (honour Range; False sends the whole file with 200),
``etag`` (ETag / Last-Modified validators and 304s), ``cache_control``
(the header on pages; None for none), ``fail_next(n, status, retry_after)``
(the next n requests answer that status), ``delay_next(n, seconds)`` and
``basic_auth`` ((user, password): every request without them gets 401),
``break_next(n, fault)``: the next n project pages come back broken (`PageFault`),
``vary`` (the Vary header of pages), ``metadata_hash`` (False advertises PEP 658
metadata as plain ``true``), ``trickle`` (seconds between the bytes of a page body),
``hang_paths`` (requests under these paths wait 60 s), ``serve_page(prefix, project, body, headers)`` and ``serve_metadata_as(prefix,
filename, body, content_type)``: answer that URL with those bytes instead.
The index's root (``/<prefix>/``) lists its projects (PEP 503).

Pages live at ``/<prefix>/<project>/``; files at ``/<prefix>/files/<filename>``
(HTML links are relative, JSON links absolute).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from packaging.utils import canonicalize_name

from tests.support.wheels import BuiltWheel

__all__ = ["IndexServer", "IndexedFile", "PageFault", "RequestRecord", "ServerStats"]

#: How `IndexServer.break_next` breaks a project page:
#: "portal" - HTTP 200 HTML of a login page (links, none to a file);
#: "blank" - HTTP 200 HTML with no links at all (an error page served as 200);
#: "short-length" - the page cut to half, with a Content-Length that says so;
#: "cut" - Content-Length of the whole page, half of it sent, then the connection closed;
#: "reset" - as "cut", but the connection is reset (RST).
PageFault = Literal["portal", "blank", "short-length", "cut", "reset"]
_PORTAL = (
    b"<!DOCTYPE html><html><head><title>Sign in to the network</title></head><body>"
    b'<a href="/login">Sign in</a> <a href="/terms">Terms</a></body></html>'
)
_BLANK = b"<!DOCTYPE html><html><body><p>Service temporarily unavailable</p></body></html>"

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
_LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True, kw_only=True)
class IndexedFile:
    """A wheel as an index lists it."""

    wheel: BuiltWheel
    yanked: bool | str = False  # a string is the reason
    requires_python: str | None = None  # defaults to the wheel's own


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    method: str
    path: str
    status: int
    headers: Mapping[str, str]
    body_bytes: int  # what the response carried; `ServerStats.bytes_sent` subtracts unsent bytes


@dataclass(kw_only=True)
class ServerStats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrivals: int = 0  # requests received, counted before any delay or answer
    requests: int = 0  # requests answered
    bytes_sent: int = 0
    log: list[RequestRecord] = field(default_factory=list)

    def arrived(self) -> None:
        with self.lock:
            self.arrivals += 1

    def record(self, entry: RequestRecord) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_sent += entry.body_bytes
            self.log.append(entry)

    def unsent(self, count: int) -> None:
        """Take back bytes a client did not read (it closed the connection)."""
        with self.lock:
            self.bytes_sent -= count

    def paths(self) -> list[str]:
        with self.lock:
            return [r.path for r in self.log]

    def reset(self) -> None:
        with self.lock:
            self.arrivals = 0
            self.requests = 0
            self.bytes_sent = 0
            self.log.clear()


class IndexServer:
    def __init__(
        self,
        *,
        format: Literal["auto", "json", "html"] = "auto",
        advertise_metadata: bool = True,
        serve_metadata: bool = True,
        ranges: bool = True,
        etag: bool = True,
        cache_control: str | None = "max-age=0",
        basic_auth: tuple[str, str] | None = None,
        vary: str = "Accept",
        metadata_hash: bool = True,
        trickle: float | None = None,
    ) -> None:
        self.basic_auth = basic_auth
        self.vary = vary
        self.metadata_hash = metadata_hash
        self.trickle = trickle
        self.hang_paths: set[str] = set()  # requests for paths starting so wait 60 s
        self._pages: dict[tuple[str, str], tuple[bytes, dict[str, str]]] = {}
        self._metadata: dict[tuple[str, str], tuple[bytes, str]] = {}
        self.format = format
        self.advertise_metadata = advertise_metadata
        self.serve_metadata = serve_metadata
        self.ranges = ranges
        self.etag = etag
        self.cache_control = cache_control
        self.stats = ServerStats()
        self._indexes: dict[str, dict[str, list[IndexedFile]]] = {}
        self._failures: list[tuple[int, int | None]] = []
        self._delays: list[float] = []
        self._page_faults: list[PageFault] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- configuration ----------------------------------------------------------------------

    def add_index(
        self, prefix: str, projects: Mapping[str, Sequence[IndexedFile | BuiltWheel]]
    ) -> str:
        """Serve ``projects`` under ``/<prefix>/``; returns that index's URL."""
        prefix = prefix.strip("/")
        index = self._indexes.setdefault(prefix, {})
        for project, files in projects.items():
            entries = index.setdefault(str(canonicalize_name(project)), [])
            entries += [f if isinstance(f, IndexedFile) else IndexedFile(wheel=f) for f in files]
        return self.index_url(prefix)

    def serve_page(
        self, prefix: str, project: str, body: bytes, headers: Mapping[str, str]
    ) -> None:
        """Answer ``project``'s page with ``body`` and ``headers`` (HTTP 200) from now on."""
        key = (prefix.strip("/"), str(canonicalize_name(project)))
        with self._lock:
            self._pages[key] = (body, dict(headers))

    def serve_metadata_as(
        self, prefix: str, filename: str, body: bytes, content_type: str = "text/plain"
    ) -> None:
        """Answer ``<filename>.metadata`` with ``body`` (HTTP 200) from now on; an empty
        ``body`` goes back to the wheel's real metadata."""
        with self._lock:
            if body:
                self._metadata[(prefix.strip("/"), filename)] = (body, content_type)
            else:
                self._metadata.pop((prefix.strip("/"), filename), None)

    def fail_next(self, count: int, status: int = 503, retry_after: int | None = None) -> None:
        """The next ``count`` requests answer ``status`` (with Retry-After if given)."""
        with self._lock:
            self._failures += [(status, retry_after)] * count

    def delay_next(self, count: int, seconds: float) -> None:
        """The next ``count`` requests wait ``seconds`` before answering (client timeouts)."""
        with self._lock:
            self._delays += [seconds] * count

    def break_next(self, count: int, fault: PageFault) -> None:
        """The next ``count`` project page requests come back broken in the way ``fault`` says."""
        with self._lock:
            self._page_faults += [fault] * count

    def _take_page_fault(self) -> PageFault | None:
        with self._lock:
            return self._page_faults.pop(0) if self._page_faults else None

    def _take_delay(self) -> float:
        with self._lock:
            return self._delays.pop(0) if self._delays else 0.0

    def _take_failure(self) -> tuple[int, int | None] | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def index_url(self, prefix: str) -> str:
        return f"{self.url}/{prefix.strip('/')}"

    def file_url(self, prefix: str, filename: str) -> str:
        return f"{self.url}/{prefix.strip('/')}/files/{urllib.parse.quote(filename)}"

    def start(self) -> IndexServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> IndexServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- content ----------------------------------------------------------------------------

    def _lookup_file(self, prefix: str, filename: str) -> IndexedFile | None:
        for files in self._indexes.get(prefix, {}).values():
            for entry in files:
                if entry.wheel.filename == filename:
                    return entry
        return None

    def _requires_python(self, entry: IndexedFile) -> str | None:
        return entry.requires_python or entry.wheel.requires_python

    def render_json(self, prefix: str, project: str) -> bytes:
        files = []
        for entry in self._indexes[prefix][project]:
            w = entry.wheel
            item: dict[str, object] = {
                "filename": w.filename,
                "url": self.file_url(prefix, w.filename),
                "hashes": {"sha256": w.sha256},
                "requires-python": self._requires_python(entry),
                "yanked": entry.yanked,
                "size": w.size,
            }
            if self.advertise_metadata and self.metadata_hash:
                item["core-metadata"] = {"sha256": hashlib.sha256(w.metadata).hexdigest()}
            elif self.advertise_metadata:
                item["core-metadata"] = True
            files.append(item)
        versions = sorted({e.wheel.version for e in self._indexes[prefix][project]})
        doc = {
            "meta": {"api-version": "1.1"},
            "name": project,
            "files": files,
            "versions": versions,
        }
        return json.dumps(doc).encode()

    def render_html(self, prefix: str, project: str) -> bytes:
        lines = [
            "<!DOCTYPE html>",
            '<html><head><meta name="pypi:repository-version" content="1.0"></head><body>',
            f"<h1>Links for {html.escape(project)}</h1>",
        ]
        for entry in self._indexes[prefix][project]:
            w = entry.wheel
            attrs = [f'href="../files/{urllib.parse.quote(w.filename)}#sha256={w.sha256}"']
            rp = self._requires_python(entry)
            if rp:
                attrs.append(f'data-requires-python="{html.escape(rp)}"')
            if entry.yanked is not False:
                reason = entry.yanked if isinstance(entry.yanked, str) else ""
                attrs.append(f'data-yanked="{html.escape(reason)}"')
            if self.advertise_metadata and self.metadata_hash:
                digest = hashlib.sha256(w.metadata).hexdigest()
                attrs.append(f'data-core-metadata="sha256={digest}"')
                attrs.append(f'data-dist-info-metadata="sha256={digest}"')
            elif self.advertise_metadata:
                attrs.append('data-core-metadata="true"')
            lines.append(f"<a {' '.join(attrs)}>{html.escape(w.filename)}</a><br/>")
        lines.append("</body></html>")
        return "\n".join(lines).encode()


def _wants_json(accept: str) -> bool:
    """Content negotiation reduced to what the Simple API needs: the highest q wins."""
    best_type, best_q = "", -1.0
    for part in accept.split(","):
        pieces = [p.strip() for p in part.split(";")]
        q = 1.0
        for param in pieces[1:]:
            if param.startswith("q="):
                q = float(param[2:])
        if pieces[0] in (JSON_TYPE, HTML_TYPE, "text/html") and q > best_q:
            best_type, best_q = pieces[0], q
    return best_type == JSON_TYPE


def _make_handler(server: IndexServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _finish(
            self, status: int, body: bytes, headers: Mapping[str, str], *, send_body: bool = True
        ) -> None:
            # Recorded before anything goes out, so a client that has the response sees the record.
            record = RequestRecord(
                method=self.command,
                path=self.path,
                status=status,
                headers={k.lower(): v for k, v in self.headers.items()},
                body_bytes=len(body) if send_body else 0,
            )
            server.stats.record(record)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not (send_body and body):
                return
            sent = 0
            try:
                for i in range(0, len(body), 64 * 1024):
                    chunk = body[i : i + 64 * 1024]
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                server.stats.unsent(record.body_bytes - sent)

        def do_HEAD(self) -> None:
            self._serve(send_body=False)

        def do_GET(self) -> None:
            self._serve(send_body=True)

        def _serve(self, *, send_body: bool) -> None:
            server.stats.arrived()
            if server.basic_auth is not None:
                token = base64.b64encode(":".join(server.basic_auth).encode()).decode()
                if self.headers.get("Authorization") != f"Basic {token}":
                    challenge = {"WWW-Authenticate": 'Basic realm="index"'}
                    self._finish(401, b"unauthorized\n", challenge, send_body=send_body)
                    return
            if any(self.path.startswith(h) for h in server.hang_paths):
                time.sleep(60)
            delay = server._take_delay()
            if delay:
                time.sleep(delay)
            failure = server._take_failure()
            if failure is not None:
                status, retry_after = failure
                headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                self._finish(status, b"injected failure\n", headers, send_body=send_body)
                return
            path = urllib.parse.urlsplit(self.path).path
            parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
            if "/".join(parts) in server._indexes and path.endswith("/"):
                self._serve_root("/".join(parts), send_body=send_body)
                return
            for cut in range(len(parts) - 1, 0, -1):
                prefix = "/".join(parts[:cut])
                if prefix in server._indexes:
                    rest = parts[cut:]
                    break
            else:
                self._finish(404, b"not found\n", {}, send_body=send_body)
                return
            if len(rest) == 2 and rest[0] == "files":
                self._serve_file(prefix, rest[1], send_body=send_body)
            elif len(rest) == 1 and path.endswith("/"):
                self._serve_page(prefix, str(canonicalize_name(rest[0])), send_body=send_body)
            elif len(rest) == 1:
                self._finish(301, b"", {"Location": path + "/"}, send_body=send_body)
            else:
                self._finish(404, b"not found\n", {}, send_body=send_body)

        def _serve_root(self, prefix: str, *, send_body: bool) -> None:
            links = "".join(
                f'<a href="{html.escape(p)}/">{html.escape(p)}</a><br/>'
                for p in sorted(server._indexes[prefix])
            )
            body = (
                '<!DOCTYPE html><html><head><meta name="pypi:repository-version" '
                f'content="1.0"></head><body>{links}</body></html>'
            ).encode()
            self._finish(200, body, {"Content-Type": HTML_TYPE}, send_body=send_body)

        def _serve_page(self, prefix: str, project: str, *, send_body: bool) -> None:
            override = server._pages.get((prefix, project))
            if override is not None:
                self._finish(200, override[0], override[1], send_body=send_body)
                return
            if project not in server._indexes[prefix]:
                self._finish(404, b"no such project\n", {}, send_body=send_body)
                return
            fault = server._take_page_fault()
            if fault in ("portal", "blank"):
                body = _PORTAL if fault == "portal" else _BLANK
                self._finish(200, body, {"Content-Type": "text/html"}, send_body=send_body)
                return
            fmt = server.format
            if fmt == "auto":
                fmt = "json" if _wants_json(self.headers.get("Accept", "")) else "html"
            if fmt == "json":
                body, ctype = server.render_json(prefix, project), JSON_TYPE
            else:
                body, ctype = server.render_html(prefix, project), HTML_TYPE
            headers = {"Content-Type": ctype, "Vary": server.vary}
            if server.cache_control is not None:
                headers["Cache-Control"] = server.cache_control
            if fault == "short-length":
                body = body[: len(body) // 2]
            elif fault in ("cut", "reset"):
                self._break_off(body, headers, reset=fault == "reset")
                return
            if server.trickle is not None and send_body:
                self._trickle(body, headers, server.trickle)
                return
            self._validated(body, headers, send_body=send_body)

        def _trickle(self, body: bytes, headers: Mapping[str, str], delay: float) -> None:
            """The whole body, one byte every ``delay`` seconds, until the client leaves."""
            server.stats.record(
                RequestRecord(
                    method=self.command,
                    path=self.path,
                    status=200,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body_bytes=len(body),
                )
            )
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(delay)
            except OSError:
                pass
            self.close_connection = True

        def _break_off(self, body: bytes, headers: Mapping[str, str], *, reset: bool) -> None:
            """Promise the whole body, send half of it, and drop the connection."""
            server.stats.record(
                RequestRecord(
                    method=self.command,
                    path=self.path,
                    status=200,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body_bytes=len(body) // 2,
                )
            )
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if reset:  # SO_LINGER 0: close sends RST instead of FIN
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            self.close_connection = True

        def _validated(self, body: bytes, headers: dict[str, str], *, send_body: bool) -> None:
            if server.etag:
                tag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                headers["ETag"] = tag
                headers["Last-Modified"] = _LAST_MODIFIED
                if self.headers.get("If-None-Match") == tag:
                    self._finish(304, b"", headers, send_body=False)
                    return
            self._finish(200, body, headers, send_body=send_body)

        def _serve_file(self, prefix: str, filename: str, *, send_body: bool) -> None:
            if filename.endswith(".metadata"):
                served = server._metadata.get((prefix, filename[: -len(".metadata")]))
                if served is not None:
                    body, ctype = served
                    self._finish(200, body, {"Content-Type": ctype}, send_body=send_body)
                    return
                entry = server._lookup_file(prefix, filename[: -len(".metadata")])
                if entry is None or not server.serve_metadata:
                    self._finish(404, b"not found\n", {}, send_body=send_body)
                    return
                self._validated(
                    entry.wheel.metadata, {"Content-Type": "text/plain"}, send_body=send_body
                )
                return
            entry = server._lookup_file(prefix, filename)
            if entry is None:
                self._finish(404, b"not found\n", {}, send_body=send_body)
                return
            data = entry.wheel.path.read_bytes()
            headers = {"Content-Type": "application/octet-stream"}
            requested = self.headers.get("Range")
            if server.ranges:
                headers["Accept-Ranges"] = "bytes"
            if not (server.ranges and requested):
                self._finish(200, data, headers, send_body=send_body)
                return
            match = _RANGE.fullmatch(requested.strip())
            if match is None or (not match.group(1) and not match.group(2)):
                self._finish(
                    416,
                    b"bad range\n",
                    {"Content-Range": f"bytes */{len(data)}"},
                    send_body=send_body,
                )
                return
            first, last = match.group(1), match.group(2)
            if not first:
                start, end = max(0, len(data) - int(last)), len(data) - 1
            else:
                start = int(first)
                end = min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data) or end < start:
                self._finish(
                    416,
                    b"bad range\n",
                    {"Content-Range": f"bytes */{len(data)}"},
                    send_body=send_body,
                )
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._finish(206, data[start : end + 1], headers, send_body=send_body)

    return Handler
