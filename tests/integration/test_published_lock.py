"""``--lock URL``: a published lockfile served on loopback is downloaded, its content hash
checked like a local file's, and its pylocks fetched beside it for export."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuilder.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A published site's layout (compat.lock.json and locks/) over loopback http."""
    root = tmp_path_factory.mktemp("site")
    shutil.copytree(DATA / "locks", root / "locks")
    lock = ["lock", "--resolution", str(root / "locks" / "resolution.json")]
    assert (
        main([*lock, "--results", str(DATA / "results"), "-o", str(root / "compat.lock.json")]) == 0
    )
    tampered = json.loads((root / "compat.lock.json").read_text())
    tampered["combinations"][0]["id"] = "edited"
    (root / "tampered.lock.json").write_text(json.dumps(tampered))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/", root
    server.shutdown()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))


def test_query_reads_a_published_lockfile(
    site: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = site
    assert main(["query", "--lock", url + "compat.lock.json", "--python", "3.11", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches"][0]["id"] == VERIFIED


def test_export_fetches_the_combinations_pylock(site: tuple[str, Path], tmp_path: Path) -> None:
    url, root = site
    out = tmp_path / "pylock.demo.toml"
    assert main(["export", VERIFIED, "--lock", url + "compat.lock.json", "-o", str(out)]) == 0
    assert out.read_bytes() == (root / "locks" / f"pylock.{VERIFIED}.toml").read_bytes()


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("tampered.lock.json", "content_sha256"),
        ("absent.lock.json", "cannot download"),
    ],
)
def test_a_bad_download_is_refused(
    site: tuple[str, Path], path: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = site
    assert main(["query", "--lock", url + path]) != 0
    err = capsys.readouterr().err
    assert says in err and path in err


@pytest.mark.parametrize(
    "url", ["http://example.invalid/compat.lock.json", "ftp://127.0.0.1/compat.lock.json"]
)
def test_only_https_or_loopback_http(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--lock", url]) == 2
    assert "over https only" in capsys.readouterr().err


def test_asking_again_revalidates_instead_of_downloading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--lock URL`` a second time: a conditional request answered 304, not the bytes again."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    lock = ["lock", "--resolution", str(tmp_path / "locks" / "resolution.json")]
    out = ["--results", str(DATA / "results"), "-o", str(tmp_path / "compat.lock.json")]
    assert main([*lock, *out]) == 0
    answered: list[tuple[str, int]] = []
    body = (tmp_path / "compat.lock.json").read_bytes()
    etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'

    class Site(http.server.BaseHTTPRequestHandler):
        """The lockfile with an ETag, as a static site serves it; 304 to a matching one."""

        def do_GET(self) -> None:
            if self.headers.get("If-None-Match") == etag:
                self.send_response(304)
                self.send_header("ETag", etag)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("ETag", etag)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            answered.append((self.path, int(code)))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/compat.lock.json"
    try:
        for _ in range(2):
            assert main(["query", "--lock", url, "--python", "3.11", "--json"]) == 0
            assert json.loads(capsys.readouterr().out)["matches"][0]["id"] == VERIFIED
    finally:
        server.shutdown()
    assert answered == [("/compat.lock.json", 200), ("/compat.lock.json", 304)]
