"""``install`` of a source build takes the wheel published beside the lockfile.

The GPU matrix run publishes the built wheel and its build record as release assets
beside ``compat.lock.json``; a release is served here over loopback http. The wheel is
installed only when its sha256 is the one the lockfile's build record pins; it then
lies in the build cache, where the next install (and an image build) finds it.
"""

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
from envbuilder.sourcebuild.cache import RECORD_NAME
from envbuilder.sourcebuild.published import record_asset, wheel_asset
from tests.unit.test_source_build_lockfile import (
    BUILT,
    KEY,
    fake_wheel,
    locked_with_wheel,
    record,
    workdir,
)

__all__ = ["workdir"]  # the fixture used here

WHEEL_NAME = "xformers-0.0.35-py39-none-linux_x86_64.whl"


class _Release(http.server.SimpleHTTPRequestHandler):
    asked: list[str]

    def do_GET(self) -> None:
        self.asked.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def release(workdir: Path) -> Iterator[tuple[str, list[str]]]:
    """The lockfile and its locks served as a release serves its assets; the requested paths."""
    asked: list[str] = []
    handler = type("Handler", (_Release,), {"asked": asked})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(workdir))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/compat.lock.json", asked
    server.shutdown()
    server.server_close()


def publish(workdir: Path, built: Path, served: bytes | None = None) -> str:
    """Lock *built* as BUILT's measured wheel and publish it (or *served* bytes under its
    name) with its build record beside the lockfile; the wheel's sha256."""
    locked_with_wheel(workdir, built)
    sha = hashlib.sha256(built.read_bytes()).hexdigest()
    (workdir / wheel_asset(BUILT, built.name)).write_bytes(
        built.read_bytes() if served is None else served
    )
    data = record()
    data["wheel"] = {"filename": built.name, "sha256": sha, "size": built.stat().st_size}
    (workdir / record_asset(BUILT)).write_text(json.dumps(data))
    shutil.rmtree(built.parent)  # nothing local: the release is the only copy
    return sha


def install(url: str, cache: Path) -> int:
    argv = ["install", BUILT, "--allow-unverified", "--lock", url, "--dry-run"]
    return main([*argv, "--installer", "pip", "--build-cache", str(cache)])


def test_the_asset_names_are_unique_per_combination_and_keep_to_safe_characters() -> None:
    assert wheel_asset(BUILT, WHEEL_NAME) == f"{BUILT}.{WHEEL_NAME}"
    assert wheel_asset("a", "x-1.0+cu130-py3-none-any.whl") == "a.x-1.0_cu130-py3-none-any.whl"
    assert record_asset(BUILT) == f"build-record.{BUILT}.json"


def test_the_published_wheel_is_downloaded_checked_and_cached(
    workdir: Path, release: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, asked = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built)
    cache = workdir / "build-cache"
    capsys.readouterr()
    assert install(url, cache) == 0
    err = capsys.readouterr().err
    assert f"xformers: the published build {WHEEL_NAME} (sha256 {sha[:12]}, checked)" in err
    cached = cache / KEY / WHEEL_NAME
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha
    kept = json.loads((cache / KEY / RECORD_NAME).read_text())
    assert (kept["key"], kept["wheel"]["sha256"]) == (KEY, sha)
    assert kept["source"].endswith(record_asset(BUILT))  # the published record, kept
    commands = [line for line in err.splitlines() if "pip install --no-deps --no-index" in line]
    assert len(commands) == 1 and commands[0].endswith(f"/{WHEEL_NAME}")
    assert f"/{wheel_asset(BUILT, WHEEL_NAME)}" in asked
    # the next install finds it in the build cache: the wheel is not downloaded again
    asked.clear()
    assert install(url, cache) == 0
    assert "the published build" not in capsys.readouterr().err
    assert f"/{wheel_asset(BUILT, WHEEL_NAME)}" not in asked


def test_a_published_wheel_with_another_hash_is_refused_and_not_cached(
    workdir: Path, release: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built, served=b"a rebuild: other bytes")
    other = hashlib.sha256(b"a rebuild: other bytes").hexdigest()
    cache = workdir / "build-cache"
    capsys.readouterr()
    assert install(url, cache) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"has sha256 {other}, not the {sha} that the lockfile's build record pins" in err
    assert "it was not installed nor cached" in err
    assert not (cache / KEY).exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no partial download left


def test_without_a_published_wheel_install_says_how_to_get_one(
    workdir: Path, release: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = release
    built = fake_wheel(workdir / "built")
    publish(workdir, built)
    (workdir / wheel_asset(BUILT, WHEEL_NAME)).unlink()
    capsys.readouterr()
    assert install(url, workdir / "build-cache") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"nothing is published at {url.removesuffix('compat.lock.json')}" in err
    assert "(HTTP 404), and" in err
    assert f"or build one with `envbuilder build-wheel {BUILT}`" in err
