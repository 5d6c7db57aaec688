"""Generated inputs that check what readers and `lock` *mean*, beside not crashing.

- a number JSON cannot hold (NaN, Infinity, 1e999, an integer of thousands of digits),
  spliced anywhere a value stands, is refused by every JSON reader, naming the file;
- a lockfile written by `lock` reads back as the same record, and any one value changed
  without resealing is refused as tampered;
- `lock` gives the same bytes whatever order its results files come in;
- every command that reads a file exits 2 with one line naming the problem, whatever
  bytes the file holds (non-UTF-8, deep nesting, numbers JSON cannot hold).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuilder.aggregate.results import Rejected, read_results
from envbuilder.cli import main
from envbuilder.errors import EnvbuilderError
from envbuilder.lockfile.canonical import HASH_KEY
from envbuilder.lockfile.read import load_lockfile
from envbuilder.model import load_resolution

DATA = Path(__file__).resolve().parents[1] / "data"
PROPERTIES = settings(
    max_examples=40,
    deadline=timedelta(seconds=10),
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NOT_JSON_NUMBERS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "9" * 4301, "-" + "1" * 5000]
)
#: a JSON scalar value in the text, where a number can stand instead
_SCALAR = re.compile(r'(?<=: )(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|"[^"\\]*")')


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the synthetic locks, results and the lockfile `lock` made of them."""
    root = tmp_path_factory.mktemp("built")
    shutil.copytree(DATA / "locks", root / "locks")
    shutil.copytree(DATA / "results", root / "results")
    here = Path.cwd()
    try:
        import os

        os.chdir(root)
        assert main(["lock", "--resolution", "locks/resolution.json", "--results", "results"]) == 0
    finally:
        os.chdir(here)
    return root


def _splice(text: str, index: int, number: str) -> str:
    spots = list(_SCALAR.finditer(text))
    spot = spots[index % len(spots)]
    return text[: spot.start()] + number + text[spot.end() :]


def _refused(reader: Callable[[Path], Any], path: Path) -> str:
    with pytest.raises((EnvbuilderError, Rejected)) as caught:
        reader(path)
    message = str(caught.value)
    assert str(path) in message or path.name in message, message
    return message


@PROPERTIES
@given(index=st.integers(min_value=0), number=NOT_JSON_NUMBERS)
def test_a_number_json_cannot_hold_is_refused_by_every_json_reader(
    built: Path, tmp_path: Path, index: int, number: str
) -> None:
    readers: list[tuple[Path, Callable[[Path], Any]]] = [
        (built / "compat.lock.json", load_lockfile),
        (built / "locks" / "resolution.json", load_resolution),
        (next((built / "results").glob("*.json")), read_results),
    ]
    for source, reader in readers:
        path = tmp_path / source.name
        path.write_text(_splice(source.read_text(), index, number))
        assert "not valid JSON" in _refused(reader, path)


@PROPERTIES
@given(index=st.integers(min_value=0), value=st.sampled_from(['"x"', "0", "1.5", "true", "null"]))
def test_the_lockfile_reads_back_and_one_value_changed_is_refused(
    built: Path, tmp_path: Path, index: int, value: str
) -> None:
    original = (built / "compat.lock.json").read_text()
    assert (
        load_lockfile(built / "compat.lock.json").to_json()
        == load_lockfile(built / "compat.lock.json").to_json()
    )
    changed = _splice(original, index, value)
    if json.loads(changed) == json.loads(original):
        return  # the same value written again: nothing was changed
    data = json.loads(changed)
    if data.get(HASH_KEY) != json.loads(original)[HASH_KEY]:
        return  # the hash itself was changed: refused as a mismatch too, checked below
    path = tmp_path / "compat.lock.json"
    path.write_text(changed)
    message = _refused(load_lockfile, path)
    assert "content_sha256 mismatch" in message or "malformed" in message, message


def test_the_lockfile_reads_back_as_the_record_lock_wrote(built: Path) -> None:
    from envbuilder.lockfile.canonical import seal

    lock = load_lockfile(built / "compat.lock.json")
    assert seal(lock.to_json()) == (built / "compat.lock.json").read_bytes()


def test_a_changed_hash_is_refused(built: Path, tmp_path: Path) -> None:
    data = json.loads((built / "compat.lock.json").read_text())
    data[HASH_KEY] = "0" * 64
    path = tmp_path / "compat.lock.json"
    path.write_text(json.dumps(data))
    assert "content_sha256 mismatch" in _refused(load_lockfile, path)


@settings(PROPERTIES, max_examples=6)
@given(order=st.permutations(sorted(p.name for p in (DATA / "results").glob("*.json"))))
def test_lock_gives_the_same_bytes_whatever_the_order_of_its_results(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: list[str]
) -> None:
    monkeypatch.chdir(built)
    out = built / "again.json"  # beside the first: the paths inside are relative to it
    files = [f"results/{name}" for name in order]
    argv = ["lock", "--resolution", "locks/resolution.json", "--results", *files, "-o", str(out)]
    assert main(argv) == 0
    assert out.read_bytes() == (built / "compat.lock.json").read_bytes()


GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=50).map(lambda b: b"\xff\xfe" + b),  # not UTF-8
    st.integers(min_value=70, max_value=3000).map(lambda n: b"[" * n + b"]" * n),  # deep
    NOT_JSON_NUMBERS.map(lambda n: f'{{"schema": "envbuilder.compat/3", "x": {n}}}'.encode()),
)
#: each command that reads a file, with that file's option
READERS: list[tuple[str, list[str]]] = [
    ("query", ["query", "--lock", "FILE"]),
    ("export", ["export", "py3.11-default-torch2.5.1-xformers0.0.28.post3", "--lock", "FILE"]),
    ("doctor", ["doctor", "--lock", "FILE", "--no-probe"]),
    ("publish", ["publish", "--lock", "FILE", "-o", "SITE"]),
    ("install", ["install", "--lock", "FILE", "--dry-run", "--allow-unverified"]),
    ("lock", ["lock", "--resolution", "FILE"]),
    ("matrix", ["matrix", "--resolution", "FILE"]),
    ("resolve", ["resolve", "--offline", "--matrix", "FILE"]),
    ("repro", ["repro", "attention.sdpa.none.fp16", "--results", "FILE"]),
]


@pytest.mark.parametrize(("command", "argv"), READERS, ids=[c for c, _ in READERS])
@settings(PROPERTIES, max_examples=25)
@given(garbage=GARBAGE)
def test_every_command_exits_2_on_a_file_it_cannot_read(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    argv: list[str],
    garbage: bytes,
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "input.file"
    path.write_bytes(garbage)
    site = tmp_path / "site-out"
    args = [str(path) if a == "FILE" else str(site) if a == "SITE" else a for a in argv]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    said = f"envbuilder {command}: error: "
    assert err.count(said) == 1 and not err.split(said)[1].startswith(" "), err
    assert "Traceback" not in err
    assert not site.exists()
