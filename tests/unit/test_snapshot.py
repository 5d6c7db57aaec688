"""The lockfile snapshot the wheel carries (``envbuilder/data/``): committed to the repository,
so it holds the lockfile only unless told otherwise, and it never names a package index.

The committed snapshot itself is checked here too: it must load, carry no pylock and name no
host outside the allowed ones.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.snapshot import foreign_hosts, require_locks, write_snapshot
from envbuilder.errors import InputError
from envbuilder.lockfile.model import DEFAULT_LOCKFILE
from envbuilder.lockfile.read import load_lockfile

DATA = Path(__file__).parents[1] / "data"
COMMITTED = Path(__file__).parents[2] / "envbuilder" / "data"
VERIFIED = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.fixture
def lockfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic pipeline's lockfile, its pylocks beside it."""
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0
    return tmp_path / "compat.lock.json"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        (b'url = "https://wheels.invalid/a.whl"', []),
        (b'url = "http://127.0.0.1:8080/simple/"', []),
        (b'url = "http://[::1]:8080/simple/"', []),
        (b'"http://localhost/x" "https://docs.example/y" "https://a.test/z"', []),
        (b"visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0208.html", []),
        (b'url = "https://index.corp.lan/packages/torch.whl"', ["index.corp.lan"]),
        (b'url = "https://user:secret@mirror.lan:8443/simple/"', ["mirror.lan"]),
        (
            b"see HTTPS://Files.Host.Lan/x and https://files.host.lan/y",
            ["Files.Host.Lan", "files.host.lan"],
        ),
        (b"no url here: torch==2.5.1", []),
    ],
)
def test_foreign_hosts_finds_every_host_but_reserved_and_allowed_ones(
    text: bytes, hosts: list[str]
) -> None:
    assert foreign_hosts(text) == hosts


def test_an_allowed_host_passes() -> None:
    assert foreign_hosts(b"https://site.lan/compat.lock.json", frozenset({"site.lan"})) == []


def test_a_snapshot_is_the_lockfile_only_by_default(lockfile: Path, tmp_path: Path) -> None:
    written = write_snapshot(lockfile, tmp_path / "data")
    assert [p.name for p in written] == ["README.md", DEFAULT_LOCKFILE]
    assert (tmp_path / "data" / DEFAULT_LOCKFILE).read_bytes() == lockfile.read_bytes()


def test_with_locks_carries_the_pylocks_of_reserved_hosts(lockfile: Path, tmp_path: Path) -> None:
    written = write_snapshot(lockfile, tmp_path / "data", with_locks=True)
    assert f"pylock.{VERIFIED}.toml" in {p.name for p in written}


def lock_from_an_index_host(lockfile: Path) -> None:
    """Make *lockfile*'s verified combination a lock of an index at ``index.corp.lan``:
    its pylock names that host, and the resolution and the lockfile are made again."""
    pylock = lockfile.parent / "locks" / f"pylock.{VERIFIED}.toml"
    old = hashlib.sha256(pylock.read_bytes()).hexdigest()
    pylock.write_bytes(pylock.read_bytes().replace(b"wheels.invalid", b"index.corp.lan"))
    new = hashlib.sha256(pylock.read_bytes()).hexdigest()
    resolution = lockfile.parent / "locks" / "resolution.json"
    resolution.write_text(resolution.read_text().replace(old, new))
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", str(DATA / "results")]
    assert main([*argv, "-o", "compat.lock.json"]) == 0


def test_a_pylock_naming_an_index_host_is_refused_and_nothing_is_replaced(
    lockfile: Path, tmp_path: Path
) -> None:
    out = tmp_path / "data"
    write_snapshot(lockfile, out)
    before = sorted(p.name for p in out.iterdir())
    lock_from_an_index_host(lockfile)
    with pytest.raises(InputError, match=r"names the host\(s\) index\.corp\.lan; .*--with-locks"):
        write_snapshot(lockfile, out, with_locks=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert write_snapshot(lockfile, out, with_locks=True, allow_hosts=frozenset({"index.corp.lan"}))


def test_the_snapshot_command_writes_the_lockfile_and_refuses_an_index_host(
    lockfile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``envbuilder snapshot`` (what ``nox -s snapshot`` runs): the lockfile and a README;
    with ``--with-locks`` a pylock naming an index host stops it, exit 2, nothing replaced."""
    out = tmp_path / "data"
    assert main(["snapshot", str(lockfile), str(out)]) == 0
    assert (out / DEFAULT_LOCKFILE).read_bytes() == lockfile.read_bytes()
    assert "`envbuilder snapshot`" in (out / "README.md").read_text(encoding="utf-8")
    lock_from_an_index_host(lockfile)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["snapshot", str(lockfile), str(out), "--with-locks"]) == 2
    assert "index.corp.lan" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_lockfile_only_snapshot_needs_no_locks_where_it_records_the_packages(
    lockfile: Path, tmp_path: Path
) -> None:
    """The entries' own record of their closure is enough to install (no pylock, no host)."""
    write_snapshot(lockfile, tmp_path / "data")
    assert load_lockfile(tmp_path / "data" / DEFAULT_LOCKFILE).by_id()[VERIFIED].packages
    require_locks(tmp_path / "data" / DEFAULT_LOCKFILE, VERIFIED)  # nothing to say


def test_the_committed_snapshot_loads_and_names_no_index() -> None:
    files = sorted(p.relative_to(COMMITTED).as_posix() for p in COMMITTED.rglob("*") if p.is_file())
    assert files == ["README.md", DEFAULT_LOCKFILE]
    assert load_lockfile(COMMITTED / DEFAULT_LOCKFILE).combinations
    for name in files:
        assert foreign_hosts((COMMITTED / name).read_bytes()) == [], name
