"""``lock --previous URL``: the last published lockfile, served on loopback, is downloaded
and checked as ``--lock URL`` is, and its runs are kept."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.lockfile.read import load_lockfile

DATA = Path(__file__).resolve().parents[1] / "data"
PER_USE = "py3.12-default-torch2.10.0-xformers0.0.34"


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A site that published the lockfile of every result but PER_USE's (and a tampered copy)."""
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    others = [str(p) for p in sorted(Path("results").glob("*.json")) if PER_USE not in p.name]
    lock = ["lock", "--resolution", "locks/resolution.json"]
    # written here and then published, as the aggregate job does: run sources are results/...
    assert main([*lock, "--results", *others, "-o", "published.json"]) == 0
    shutil.copy(tmp_path / "published.json", site / "compat.lock.json")
    tampered = json.loads((site / "compat.lock.json").read_text())
    tampered["combinations"][0]["runs"] = []
    (site / "tampered.lock.json").write_text(json.dumps(tampered))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()


def test_the_published_lockfile_s_runs_are_kept(
    published: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = ["lock", "--resolution", "locks/resolution.json"]
    url = published + "compat.lock.json"
    assert main([*lock, "--results", f"results/{PER_USE}.h100.json", "--previous", url]) == 0
    assert f"and 9 run(s) kept from {url}, 0 rejected" in capsys.readouterr().err
    assert main([*lock, "--results", "results", "-o", "at-once.json"]) == 0
    assert (tmp_path / "compat.lock.json").read_bytes() == (tmp_path / "at-once.json").read_bytes()
    assert load_lockfile(tmp_path / "compat.lock.json").by_id()[PER_USE].runs


@pytest.mark.parametrize(
    ("path", "rc", "says"),
    [
        ("tampered.lock.json", 2, "content_sha256 mismatch"),  # bad input
        ("absent.json", 1, "cannot download"),  # the index/network error code
    ],
)
def test_a_bad_download_is_refused_and_nothing_is_written(
    published: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    rc: int,
    says: str,
) -> None:
    lock = ["lock", "--resolution", "locks/resolution.json", "--results", "results"]
    assert main([*lock, "--previous", published + path]) == rc
    err = capsys.readouterr().err
    assert "--previous" in err and path in err and says in err
    assert not (tmp_path / "compat.lock.json").exists()
