"""The lockfile snapshot the wheel carries is enough to install: without its pylocks (they
name their index's host) an entry's own record of its closure (name, version, wheel
filename, sha256) becomes hash-pinned requirements fetched from the user's indexes, and the
snapshot's host check reads the parsed documents, not only their bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.commands.install import pip_index_options
from envbuilder.consumer import snapshot
from envbuilder.consumer.export import exported, exported_requirements, locate_pylock
from envbuilder.consumer.install import index_options
from envbuilder.consumer.snapshot import document_hosts, foreign_hosts, write_snapshot
from envbuilder.errors import InputError
from envbuilder.lockfile.model import DEFAULT_LOCKFILE, Entry
from envbuilder.lockfile.read import load_lockfile

DATA = Path(__file__).parents[1] / "data"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture
def lockfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic pipeline's lockfile, its pylocks beside it."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0
    return tmp_path / "compat.lock.json"


@pytest.fixture
def carried(lockfile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lockfile as `envbuilder snapshot` carries it (no pylocks), as the installed one."""
    write_snapshot(lockfile, tmp_path / "data")
    path = tmp_path / "data" / DEFAULT_LOCKFILE
    monkeypatch.setattr(snapshot, "embedded", lambda: path)
    return path


def _pins(text: str) -> list[tuple[str, str]]:
    """(requirement, sha256) of a requirements file, its continuation lines joined."""
    joined = text.replace(" \\\n    ", " ")
    out = []
    for line in joined.splitlines():
        if line and not line.startswith("#"):
            requirement, _, sha = line.partition(" --hash=sha256:")
            out.append((requirement, sha))
    return out


def test_the_carried_lockfile_pins_what_the_pylock_pins_by_name_and_hash(
    lockfile: Path, carried: Path
) -> None:
    text = exported(carried, VERIFIED, "requirements").decode()
    entry = load_lockfile(lockfile).by_id()[VERIFIED]
    full = exported_requirements(entry, locate_pylock(lockfile, entry))
    by_url = _pins(full)
    assert [sha for _, sha in _pins(text)] == [sha for _, sha in by_url]
    assert [r for r, _ in _pins(text)] == [
        f"{p.name}=={p.version}" for p in sorted(entry.packages, key=lambda p: p.name)
    ]
    assert "://" not in text  # no URL, no host: the user's indexes serve the files
    assert "@" not in text


def test_export_from_the_carried_lockfile_writes_requirements_by_default(
    carried: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")  # a consumer's directory: the snapshot answers
    assert main(["export", VERIFIED]) == 0
    out = capsys.readouterr().out
    assert "torch==2.5.1 \\\n    --hash=sha256:" in out
    assert main(["export", VERIFIED, "--format", "pylock"]) == 2
    err = capsys.readouterr().err
    assert "cannot make a pylock: pass --format requirements" in err


def test_publish_from_the_carried_lockfile_writes_the_site_without_pylocks(
    carried: Path, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    assert main(["publish", "--lock", str(carried), "-o", str(out)]) == 0
    assert (out / DEFAULT_LOCKFILE).read_bytes() == carried.read_bytes()
    assert (out / "index.html").is_file()
    assert not (out / "locks").exists()


def test_a_local_lockfile_without_its_pylock_still_says_it_is_missing(
    lockfile: Path, tmp_path: Path
) -> None:
    (tmp_path / "locks" / f"pylock.{VERIFIED}.toml").unlink()
    with pytest.raises(InputError, match="is missing"):
        exported(lockfile, VERIFIED, "requirements")


def test_an_entry_recorded_without_packages_is_refused(carried: Path) -> None:
    from envbuilder.consumer.export import exported_carried

    entry = dataclasses.replace(load_lockfile(carried).by_id()[VERIFIED], packages=())
    with pytest.raises(InputError, match="records no packages"):
        exported_carried(entry, "requirements")


PYTORCH_BASE = "http://127.0.0.1:9/whl"


def _torch_from(entry: Entry, index: str) -> Entry:
    """*entry* with its torch (a CUDA 12.1 build) taken from the index named *index*."""
    from envbuilder.target import CudaTag

    torch = entry.resolved.torch
    assert torch is not None
    torch = dataclasses.replace(torch, index=index, cuda=CudaTag.from_version("12.1"))
    return dataclasses.replace(entry, resolved=dataclasses.replace(entry.resolved, torch=torch))


@pytest.mark.parametrize(
    ("installer", "environ", "torch_index", "expected"),
    [
        ("pip", {"PIP_INDEX_URL": "http://127.0.0.1:9/simple"}, "default", []),
        (
            "uv",
            {"PIP_INDEX_URL": "http://127.0.0.1:9/simple"},
            "default",
            ["--index-url", "http://127.0.0.1:9/simple"],
        ),
        (
            "uv",
            {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "UV_INDEX_URL": "http://u.test/"},
            "default",
            [],
        ),
        (
            "pip",
            {"PYTORCH_INDEX_URL": PYTORCH_BASE + "/"},
            "pytorch",
            ["--extra-index-url", PYTORCH_BASE + "/cu121"],
        ),
        (
            "uv",
            {"PYTORCH_INDEX_URL": PYTORCH_BASE, "UV_DEFAULT_INDEX": "http://u.test/"},
            "pytorch",
            [
                "--extra-index-url",
                PYTORCH_BASE + "/cu121",
                "--index-strategy",
                "unsafe-best-match",
            ],
        ),
        ("uv", {"UV_DEFAULT_INDEX": "http://u.test/"}, "pytorch", ["--torch-backend", "cu121"]),
    ],
)
def test_indexes_come_from_the_users_configuration(
    carried: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    installer: str,
    environ: dict[str, str],
    torch_index: str,
    expected: list[str],
) -> None:
    entry = _torch_from(load_lockfile(carried).by_id()[VERIFIED], torch_index)
    env = {"PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path), **environ}  # no pip.conf
    assert index_options(entry, installer, env, pip_index_options(env)) == expected


def test_pip_without_pytorch_index_url_names_the_variable(carried: Path, tmp_path: Path) -> None:
    entry = _torch_from(load_lockfile(carried).by_id()[VERIFIED], "pytorch")
    with pytest.raises(InputError, match="set PYTORCH_INDEX_URL"):
        index_options(entry, "pip", {"PIP_CONFIG_FILE": os.devnull})


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("compat.lock.json", rb'{"url": "https:\/\/index.corp.lan\/simple\/"}'),
        ("compat.lock.json", rb'{"url": "https:\u002f\u002findex.corp.lan\u002fsimple"}'),
        ("pylock.x.toml", b'url = "https:\\u002f\\u002findex.corp.lan\\u002fa.whl"\n'),
        ("pylock.x.toml", b'url = "https:\\U0000002f\\U0000002findex.corp.lan/a.whl"\n'),
    ],
)
def test_an_escaped_url_is_found_in_the_parsed_document(name: str, data: bytes) -> None:
    assert foreign_hosts(data) == []  # the bytes alone hide it
    assert document_hosts(name, data) == ["index.corp.lan"]


def test_a_pylock_naming_a_host_behind_toml_escapes_is_refused(
    lockfile: Path, tmp_path: Path
) -> None:
    pylock = lockfile.parent / "locks" / f"pylock.{VERIFIED}.toml"
    old = hashlib.sha256(pylock.read_bytes()).hexdigest()
    escaped = b"https:\\u002f\\u002findex.corp.lan\\u002f"
    pylock.write_bytes(pylock.read_bytes().replace(b"https://wheels.invalid/", escaped))
    new = hashlib.sha256(pylock.read_bytes()).hexdigest()
    resolution = lockfile.parent / "locks" / "resolution.json"
    resolution.write_text(resolution.read_text().replace(old, new))
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0
    with pytest.raises(InputError, match=r"names the host\(s\) index\.corp\.lan"):
        write_snapshot(lockfile, tmp_path / "out", with_locks=True)
    assert not (tmp_path / "out").exists()
