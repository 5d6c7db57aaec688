"""A container registry on loopback (the OCI distribution API, as far as ``docker push`` and
``docker pull`` use it), for tests: no registry is reachable from here.

    with RegistryServer(tmp_path / "registry") as registry:
        registry.address                 # 127.0.0.1:PORT (the daemon pushes to loopback
                                         # registries over plain HTTP without configuration)
        registry.manifest("envbuilder/x", "sha256:...")   # stored bytes and media type
        registry.tamper("envbuilder/x", "tag", manifest)  # a tag moved behind a record's back

Blobs are stored under ``root`` by digest and checked against it when an upload
completes (a mismatch is 400 ``DIGEST_INVALID``); manifests are stored by the
sha256 of their bytes, tags point at those. It can also run on its own, for a
rehearsal that hands the daemon its address: ``python -m tests.support.registry
ROOT [--port N]`` prints ``127.0.0.1:PORT`` and serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BufferedIOBase
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["RegistryServer", "main"]

_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_ROUTE = re.compile(
    rf"^/v2/(?P<name>{_NAME})/(?:(?P<kind>blobs|manifests)/(?P<ref>[A-Za-z0-9_.:-]+)"
    r"|blobs/uploads/(?P<upload>[0-9a-f-]*)|(?P<tags>tags/list))$"
)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CHUNK = 1 << 20
_DEFAULT_MEDIA = "application/vnd.oci.image.manifest.v1+json"


class RegistryServer:
    """The registry on 127.0.0.1, storing under ``root``; a context manager."""

    def __init__(self, root: Path, port: int = 0) -> None:
        self.root = root
        for part in ("blobs", "uploads", "manifests"):
            (root / part).mkdir(parents=True, exist_ok=True)
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def __enter__(self) -> RegistryServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # --- storage ---------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest.removeprefix("sha256:")

    def _tags(self, name: str) -> Path:
        return self.root / "manifests" / name.replace("/", "%2F")

    def manifest(self, name: str, reference: str) -> tuple[bytes, str] | None:
        """The stored manifest's bytes and media type, by digest or tag (None: absent)."""
        digest = reference if _DIGEST.fullmatch(reference) else self._tag_digest(name, reference)
        if digest is None:
            return None
        path = self._tags(name) / digest.removeprefix("sha256:")
        if not path.is_file():
            return None
        data = path.read_bytes()
        media = (path.with_suffix(".type")).read_text(encoding="utf-8")
        return data, media

    def _tag_digest(self, name: str, tag: str) -> str | None:
        path = self._tags(name) / f"tag-{tag}"
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def put_manifest(self, name: str, reference: str, data: bytes, media: str) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        folder = self._tags(name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / digest.removeprefix("sha256:")).write_bytes(data)
        (folder / digest.removeprefix("sha256:")).with_suffix(".type").write_text(media)
        if not _DIGEST.fullmatch(reference):
            (folder / f"tag-{reference}").write_text(digest, encoding="utf-8")
        return digest

    def tamper(self, name: str, tag: str, manifest: bytes, media: str = _DEFAULT_MEDIA) -> str:
        """Store ``manifest`` under ``tag``, as someone who can push would: the new digest."""
        return self.put_manifest(name, tag, manifest, media)

    def tags(self, name: str) -> list[str]:
        folder = self._tags(name)
        if not folder.is_dir():
            return []
        return sorted(p.name.removeprefix("tag-") for p in folder.glob("tag-*"))


def _chunks(stream: BufferedIOBase, headers: Any) -> Iterator[bytes]:
    """A request body, by Content-Length or chunked transfer coding."""
    if "chunked" in str(headers.get("Transfer-Encoding", "")).lower():
        while True:
            size = int(stream.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while stream.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            left = size
            while left:
                piece = stream.read(min(left, _CHUNK))
                if not piece:
                    raise ConnectionError("the body ended inside a chunk")
                left -= len(piece)
                yield piece
            stream.readline()
    else:
        left = int(headers.get("Content-Length") or 0)
        while left:
            piece = stream.read(min(left, _CHUNK))
            if not piece:
                raise ConnectionError("the body ended early")
            left -= len(piece)
            yield piece


def _handler(registry: RegistryServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str) -> None:
            self._drain()
            body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
            self._send(status, body, {"Content-Type": "application/json"})

        def _drain(self) -> None:
            if self.command in ("PUT", "PATCH", "POST"):
                for _ in _chunks(self.rfile, self.headers):
                    pass

        def _route(self) -> tuple[re.Match[str] | None, dict[str, list[str]]]:
            parts = urlsplit(self.path)
            with registry._lock:
                registry.requests.append((self.command, parts.path))
            return _ROUTE.match(parts.path), parse_qs(parts.query)

        def do_GET(self) -> None:
            if urlsplit(self.path).path in ("/v2/", "/v2"):
                self._send(200, b"{}", {"Content-Type": "application/json"})
                return
            match, _ = self._route()
            if match is None:
                self._error(404, "NAME_UNKNOWN", self.path)
            elif match["tags"]:
                name = match["name"]
                body = json.dumps({"name": name, "tags": registry.tags(name)}).encode()
                self._send(200, body, {"Content-Type": "application/json"})
            elif match["kind"] == "blobs":
                self._blob(match["ref"])
            elif match["kind"] == "manifests":
                self._manifest(match["name"], match["ref"])
            else:
                self._error(404, "BLOB_UPLOAD_UNKNOWN", self.path)

        do_HEAD = do_GET

        def _blob(self, digest: str) -> None:
            path = registry.blob_path(digest)
            if not _DIGEST.fullmatch(digest) or not path.is_file():
                self._error(404, "BLOB_UNKNOWN", digest)
                return
            size = path.stat().st_size
            headers = {
                "Content-Length": str(size),
                "Content-Type": "application/octet-stream",
                "Docker-Content-Digest": digest,
            }
            self._send(200, b"", headers)
            if self.command == "GET":
                with path.open("rb") as f:
                    shutil.copyfileobj(f, self.wfile, _CHUNK)

        def _manifest(self, name: str, reference: str) -> None:
            found = registry.manifest(name, reference)
            if found is None:
                self._error(404, "MANIFEST_UNKNOWN", f"{name}:{reference}")
                return
            data, media = found
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            headers = {
                "Content-Type": media,
                "Docker-Content-Digest": digest,
                "Content-Length": str(len(data)),
            }
            self._send(200, data, headers)

        def do_POST(self) -> None:
            match, query = self._route()
            if match is None or match["upload"] != "":
                self._error(404, "NAME_UNKNOWN", self.path)
                return
            name = match["name"]
            mounted = query.get("mount", [""])[0]
            if _DIGEST.fullmatch(mounted) and registry.blob_path(mounted).is_file():
                self._drain()
                location = f"/v2/{name}/blobs/{mounted}"
                self._send(201, b"", {"Location": location, "Docker-Content-Digest": mounted})
                return
            upload = str(uuid.uuid4())
            (registry.root / "uploads" / upload).touch()
            self._drain()
            self._send(202, b"", self._upload_headers(name, upload))

        def _upload_headers(self, name: str, upload: str) -> dict[str, str]:
            size = (registry.root / "uploads" / upload).stat().st_size
            return {
                "Location": f"/v2/{name}/blobs/uploads/{upload}",
                "Docker-Upload-UUID": upload,
                "Range": f"0-{max(size - 1, 0)}",
            }

        def _append(self, upload: str) -> bool:
            path = registry.root / "uploads" / upload
            if not upload or not path.is_file():
                self._error(404, "BLOB_UPLOAD_UNKNOWN", upload)
                return False
            with path.open("ab") as f:
                for piece in _chunks(self.rfile, self.headers):
                    f.write(piece)
            return True

        def do_PATCH(self) -> None:
            match, _ = self._route()
            if match is None or not match["upload"]:
                self._error(404, "BLOB_UPLOAD_UNKNOWN", self.path)
                return
            if self._append(match["upload"]):
                self._send(202, b"", self._upload_headers(match["name"], match["upload"]))

        def do_PUT(self) -> None:
            match, query = self._route()
            if match is None:
                self._error(404, "NAME_UNKNOWN", self.path)
            elif match["upload"]:
                self._finish(match["name"], match["upload"], query.get("digest", [""])[0])
            elif match["kind"] == "manifests":
                reference = match["ref"]
                if not (_DIGEST.fullmatch(reference) or _TAG.fullmatch(reference)):
                    self._error(400, "TAG_INVALID", reference)
                    return
                data = b"".join(_chunks(self.rfile, self.headers))
                if _DIGEST.fullmatch(reference) and reference != (
                    "sha256:" + hashlib.sha256(data).hexdigest()
                ):
                    self._error(400, "DIGEST_INVALID", reference)
                    return
                media = self.headers.get("Content-Type") or _DEFAULT_MEDIA
                digest = registry.put_manifest(match["name"], reference, data, media)
                location = f"/v2/{match['name']}/manifests/{digest}"
                self._send(201, b"", {"Location": location, "Docker-Content-Digest": digest})
            else:
                self._error(405, "UNSUPPORTED", self.path)

        def _finish(self, name: str, upload: str, digest: str) -> None:
            if not self._append(upload):
                return
            path = registry.root / "uploads" / upload
            actual = hashlib.sha256()
            with path.open("rb") as f:
                while piece := f.read(_CHUNK):
                    actual.update(piece)
            if not _DIGEST.fullmatch(digest) or digest != "sha256:" + actual.hexdigest():
                path.unlink()
                self._error(400, "DIGEST_INVALID", f"{digest} is not what was uploaded")
                return
            path.replace(registry.blob_path(digest))
            location = f"/v2/{name}/blobs/{digest}"
            self._send(201, b"", {"Location": location, "Docker-Content-Digest": digest})

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("root", type=Path, help="where blobs and manifests are stored")
    parser.add_argument("--port", type=int, default=0, help="default: any free port")
    args = parser.parse_args(argv)
    server = RegistryServer(args.root, args.port)
    print(server.address, flush=True)
    with server, contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
