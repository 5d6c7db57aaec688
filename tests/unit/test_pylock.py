"""PEP 751 locks: reading into typed records, a target's part, writing locks and requirements."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.pylock import Pylock

from envbuilder.pylock import (
    LockedArchive,
    LockedPackage,
    PylockError,
    assemble,
    assembled,
    constraints_text,
    packages,
    read_lock,
    requirements_text,
    select,
    tool_table,
)
from envbuilder.target import Target

SHA_A = "a" * 64
SHA_B = "b" * 64
HEAD = 'lock-version = "1.0"\ncreated-by = "test"\n'
NUMPY = f"""
[[packages]]
name = "numpy"
version = "2.1.0"
[[packages.wheels]]
url = "https://h/files/numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl"
size = 10
hashes = {{ sha256 = "{SHA_A}" }}
[[packages.wheels]]
url = "https://h/files/numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl"
hashes = {{ sha256 = "{SHA_B}" }}
"""
SDIST = f"""
[[packages]]
name = "sdist-only"
version = "1.0"
marker = "python_version < '3.12'"
sdist = {{ url = "http://h/files/sdist-only-1.0.tar.gz", hashes = {{ sha256 = "{SHA_B}" }} }}
"""
LOCAL = f"""
[[packages]]
name = "torch"
version = "2.5.1+cu121"
[[packages.wheels]]
url = "https://h/cu121/torch-2.5.1%2Bcu121-cp311-cp311-linux_x86_64.whl"
hashes = {{ sha256 = "{SHA_A}" }}
[[packages.wheels]]
path = "wheels/torch-2.5.1+cu121-cp311-cp311-manylinux_2_28_x86_64.whl"
hashes = {{ sha256 = "{SHA_B}" }}
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lock-version = ", "lock.toml: not a TOML file"),
        ('lock-version = "1.0"\n', "lock.toml: not a valid PEP 751 lock"),
        (HEAD + '[[packages]]\nname = "x"\nversion = "1"\nwheels = [{ url = 5 }]\n', "not a valid PEP 751 lock"),
    ],
)  # fmt: skip
def test_a_lock_that_is_not_pep_751_is_an_error_naming_the_file(text: str, problem: str) -> None:
    with pytest.raises(PylockError, match=re.escape(problem)):
        read_lock(text.encode(), source=Path("lock.toml"))


def test_packages_are_typed_records_with_every_file() -> None:
    (numpy,) = packages(read_lock(HEAD + NUMPY, source="t"))
    assert numpy.archive == LockedArchive(
        kind="wheel",
        url="https://h/files/numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        sha256=SHA_A,
        size=10,
    )
    assert len(numpy.wheels) == 2


def _wheel_at(url: str) -> str:
    return f"""
[[packages]]
name = "x"
version = "1.0"
wheels = [{{ url = "{url}", hashes = {{ sha256 = "{SHA_A}" }} }}]
"""


INSTALLABLE_URLS = [
    "https://h/x-1.0-py3-none-any.whl",
    "file:///wheels/x-1.0-py3-none-any.whl",
    "http://127.0.0.1:8080/x-1.0-py3-none-any.whl",
    "http://localhost/x-1.0-py3-none-any.whl",
    "http://[::1]:9/x-1.0-py3-none-any.whl",
]
REFUSED = [
    (
        SDIST.replace("marker = \"python_version < '3.12'\"\n", ""),
        "sdist-only is locked as a source distribution (sdist-only-1.0.tar.gz)",
    ),
    (
        _wheel_at("http://h/x-1.0-py3-none-any.whl"),
        "x's file 'http://h/x-1.0-py3-none-any.whl' is not on https://",
    ),
    (
        _wheel_at("http://user:secret@h/x-1.0-py3-none-any.whl"),
        "x's file 'http://user:***@h/x-1.0-py3-none-any.whl' is not on https://",
    ),
    (
        _wheel_at("ftp://h/x-1.0-py3-none-any.whl"),
        "x's file 'ftp://h/x-1.0-py3-none-any.whl' is not on https://",
    ),
    (
        _wheel_at("http://127.0.0.1.example/x-1.0-py3-none-any.whl"),
        "x's file 'http://127.0.0.1.example/x-1.0-py3-none-any.whl' is not on https://",
    ),
]


@pytest.mark.parametrize("url", INSTALLABLE_URLS)
def test_files_on_https_file_or_loopback_are_read(url: str) -> None:
    lock = read_lock(HEAD + _wheel_at(url), source="lock.toml")
    assert [p.archive.url for p in packages(lock) if p.archive] == [url]
    assert [
        p.archive.url for p in select(lock, Target(python="3.11"), source="t") if p.archive
    ] == [url]


@pytest.mark.parametrize(("text", "problem"), REFUSED)
def test_sdists_and_files_over_plain_http_are_refused_by_every_reader(
    text: str, problem: str
) -> None:
    lock = read_lock(HEAD + text, source="lock.toml")
    with pytest.raises(PylockError, match="^" + re.escape(f"lock.toml: {problem}")):
        packages(lock, source="lock.toml")
    with pytest.raises(PylockError, match="^" + re.escape(f"lock.toml: {problem}")):
        select(lock, Target(python="3.11"), source="lock.toml")


def test_a_file_s_name_is_its_unquoted_url_or_path_and_a_path_lies_beside_the_lock() -> None:
    (torch,) = packages(read_lock(HEAD + LOCAL, source="t"))
    remote, local = torch.wheels
    assert remote.filename == "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"
    assert remote.location(Path("/locks/pylock.x.toml")) == remote.url
    assert local.filename == "torch-2.5.1+cu121-cp311-cp311-manylinux_2_28_x86_64.whl"
    location = local.location(Path("/locks/pylock.x.toml"))
    assert (
        location == "file:///locks/wheels/torch-2.5.1%2Bcu121-cp311-cp311-manylinux_2_28_x86_64.whl"
    )


@pytest.mark.parametrize(
    ("python", "expected"),
    [
        ("3.11", {"numpy": "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl"}),
        ("3.12", {"numpy": "numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl"}),
    ],
)  # fmt: skip
def test_a_target_selects_its_packages_each_with_one_file(
    python: str, expected: dict[str, str]
) -> None:
    lock = read_lock(HEAD + NUMPY, source="t")
    chosen = select(lock, Target(python=python), source="t")
    assert {p.name: p.archive.filename for p in chosen if p.archive} == expected


def test_a_target_no_file_fits_is_an_error_naming_the_target() -> None:
    lock = read_lock(HEAD + NUMPY, source="lock.toml")
    with pytest.raises(PylockError, match=re.escape("lock.toml: nothing to install for cp313")):
        select(lock, Target(python="3.13"), source="lock.toml")


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ('[tool.envbuilder]\npython = "3.11"\n', {"python": "3.11"}),
        ("[tool.uv]\n", None),
        ('tool = { envbuilder = "x" }\n', None),
        ("", None),
    ],
)
def test_tool_table(tool: str, expected: dict[str, str] | None) -> None:
    assert tool_table(read_lock(HEAD + "packages = []\n" + tool, source="t")) == expected


def test_assemble_writes_a_valid_lock_that_reads_back_to_the_same_records() -> None:
    wheel = LockedArchive(
        kind="wheel", name="x-1.0-py3-none-any.whl", url="https://h/x.whl", sha256=SHA_A, size=3
    )
    local = LockedArchive(kind="wheel", path="wheels/y-2.0-py3-none-any.whl", sha256=SHA_B)
    locked = [
        LockedPackage(name="x", version="1.0", wheels=(wheel,)),
        LockedPackage(name="y", version="2.0", wheels=(local,)),
    ]
    text = assemble(
        locked, requires_python="==3.11.*", tool={"t": {"k": "v"}}, header=["made here"]
    )
    assert text.startswith("# made here\nlock-version = ")
    lock = read_lock(text, source="t")
    assert packages(lock) == tuple(locked)
    assert tool_table(lock, "t") == {"k": "v"}
    assert isinstance(Pylock.from_dict(lock.to_dict()), Pylock)


def test_a_lock_assembled_here_reads_back_without_being_parsed_again() -> None:
    wheel = LockedArchive(
        kind="wheel", name="x-1.0-py3-none-any.whl", url="https://h/x.whl", sha256=SHA_A, size=3
    )
    locked = [LockedPackage(name="x", version="1.0", wheels=(wheel,))]
    text, lock = assembled(locked, requires_python="==3.11.*", tool={}, header=["here"])
    assert read_lock(text, source="t") is lock
    assert read_lock(text.encode(), source="t") is lock
    edited = read_lock(text + "# edited since\n", source="t")  # other text: parsed
    assert edited is not lock
    assert packages(edited) == packages(lock) == tuple(locked)


def test_assembling_an_invalid_lock_is_an_error() -> None:
    bad = LockedPackage(
        name="x", version="1.0", wheels=(LockedArchive(kind="wheel", sha256=SHA_A),)
    )
    with pytest.raises(PylockError, match="not valid PEP 751"):
        assemble([bad], requires_python="==3.11.*", tool={})


@pytest.mark.parametrize(
    ("wrap", "expected"),
    [
        (True, f"# head\n--find-links http://f/\nx==1.0 \\\n    --hash=sha256:{SHA_A}\ny @ http://h/y.whl \\\n    --hash=sha256:{SHA_B}\n"),
        (False, f"# head\n--find-links http://f/\nx==1.0 --hash=sha256:{SHA_A}\ny @ http://h/y.whl --hash=sha256:{SHA_B}\n"),
    ],
)  # fmt: skip
def test_requirements_text(wrap: bool, expected: str) -> None:
    pins = [("x==1.0", SHA_A), ("y @ http://h/y.whl", SHA_B)]
    text = requirements_text(pins, header=["head"], options=["--find-links http://f/"], wrap=wrap)
    assert text == expected


def test_no_pins_no_text() -> None:
    assert requirements_text([], wrap=False) == ""


@pytest.mark.parametrize(
    ("packages", "expected"),
    [
        (
            [("torch", "2.5.1+cu121"), ("filelock", "3.16.1")],
            "# h\nfilelock==3.16.1\ntorch==2.5.1+cu121\n",
        ),
        ([], "# h\n"),
        ([("torch", None)], PylockError),
    ],
)
def test_constraints_text(
    packages: list[tuple[str, str | None]], expected: str | type[Exception]
) -> None:
    locked = [LockedPackage(name=n, version=v) for n, v in packages]
    if isinstance(expected, str):
        assert constraints_text(locked, header=["h"]) == expected
    else:
        with pytest.raises(expected, match="without a version"):
            constraints_text(locked, header=["h"])
