"""A source build in the lockfile: the build record of the wheel that was built and measured."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from envbuilder.cli import main
from envbuilder.conformance._wheel import installed_libraries, record_libraries
from envbuilder.lockfile.read import load_lockfile
from envbuilder.lockfile.sourcebuilds import BUILD_RECORDS_DIR, record_name
from envbuilder.sourcebuild.cache import RECORD_SCHEMA
from envbuilder.sourcebuild.key import KEY_FORMAT

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]
SCHEMA = ROOT / "envbuilder" / "schemas" / "compat.schema.json"
BUILT = "py3.12-default-torch2.11.0-xformers0.0.35"
SDIST = "a" * 64
KEY = "e608dfda6e02" + "0" * 52
WHEEL = "bc57b70be871" + "1" * 52


def record(**changes: Any) -> dict[str, Any]:
    """A build record as `envbuilder build-wheel` writes it."""
    data: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "combination": BUILT,
        "key": KEY,
        "key_inputs": {"format": KEY_FORMAT, "sdist_sha256": SDIST, "arch_list": ["9.0"]},
        "mode": "in-place",
        "toolchain": "host",
        "seconds": 63.3,
        "wheel": {
            "filename": "xformers-0.0.35-py39-none-linux_x86_64.whl",
            "sha256": WHEEL,
            "size": 1892866,
        },
        "cpp_lib": {"version": {"cuda": 1300, "torch": "2.11.0+cu130"}},
    }
    data.update(changes)
    return data


def write_record(directory: Path, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / record_name(BUILT)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic locks and results, with BUILT resolved as a source build, and an active
    Python 3.12 venv with pip as its files show it (what `install` reads without running it)."""
    venv = tmp_path / "user-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nversion = 3.12.4\n")
    (venv / "lib" / "python3.12" / "site-packages" / "pip").mkdir(parents=True)
    (venv / "lib" / "python3.12" / "site-packages" / "pip" / "__init__.py").touch()
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "envbuilder-cache"))
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    resolution = tmp_path / "locks" / "resolution.json"
    data = json.loads(resolution.read_text())
    for combo in data["combinations"]:
        if combo["id"] == BUILT:
            combo["source_build"] = {
                "sdist": {
                    "filename": "xformers-0.0.35.tar.gz",
                    "url": "https://wheels.invalid/xformers-0.0.35.tar.gz",
                    "sha256": SDIST,
                    "size": 4200000,
                },
                "why": "no wheel fits: built for CUDA 12.4",
                "cuda": "13.0",
                "arch_list": ["9.0"],
                "flags": ["TORCH_CUDA_ARCH_LIST=9.0"],
                "build_requirements_in": ["setuptools>=64"],
            }
    resolution.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lock(*extra: str) -> int:
    return main(["lock", "--resolution", "locks/resolution.json", "--results", "results", *extra])


def test_without_a_build_record_the_entry_says_how_to_build_it(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock() == 0
    entries = load_lockfile(workdir / "compat.lock.json").by_id()
    build = entries[BUILT].source_build
    assert build is not None and not build.built
    assert (build.sdist_sha256, build.arch_list, build.key, build.wheel_sha256) == (
        SDIST,
        ("9.0",),
        None,
        None,
    )
    # combinations of wheels from an index have no source_build, as before
    raw = json.loads((workdir / "compat.lock.json").read_text())
    assert [c["id"] for c in raw["combinations"] if "source_build" in c] == [BUILT]
    text = f"xformers built from source: not built yet: envbuilder build-wheel {BUILT}"
    assert text in capsys.readouterr().err  # lock reports on stderr
    assert main(["query", BUILT]) == 0
    assert text in capsys.readouterr().out.splitlines()


def test_the_build_record_beside_the_locks_goes_into_the_entry(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_record(workdir / "locks", record())
    assert lock() == 0
    build = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT].source_build
    assert build is not None and build.built
    assert build.record == f"locks/{record_name(BUILT)}"
    assert (build.key, build.key_format, build.mode, build.toolchain) == (
        KEY,
        KEY_FORMAT,
        "in-place",
        "host",
    )
    assert (build.wheel_filename, build.wheel_sha256, build.wheel_size) == (
        "xformers-0.0.35-py39-none-linux_x86_64.whl",
        WHEEL,
        1892866,
    )
    assert build.cpp_lib == {"version": {"cuda": 1300, "torch": "2.11.0+cu130"}}
    text = "xformers built from source (key e608dfda6e02, wheel sha256 bc57b70be871)"
    capsys.readouterr()
    assert main(["query", BUILT]) == 0
    assert text in capsys.readouterr().out.splitlines()
    assert main(["query", BUILT, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["matches"]
    assert row["source_build"]["wheel"]["sha256"] == WHEEL and row["source_build"]["key"] == KEY
    assert main(["publish", "--lock", "compat.lock.json", "-o", "site"]) == 0
    assert f"- `{BUILT}`: {text}" in (workdir / "site" / "compat.md").read_text().splitlines()


def test_the_lockfile_stays_deterministic_and_valid(workdir: Path) -> None:
    write_record(workdir / "locks", record())
    assert lock("-o", "a.json") == 0
    assert lock("-o", "b.json") == 0
    a = (workdir / "a.json").read_bytes()
    assert a == (workdir / "b.json").read_bytes()
    assert lock("-o", "a.json", "--check") == 0
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(json.loads(a))
    # the record changes: the lockfile is out of date
    write_record(workdir / "locks", record(key="f" * 64))
    assert lock("-o", "a.json", "--check") == 1


def test_a_committed_record_is_found_and_never_read_as_results(workdir: Path) -> None:
    write_record(workdir / BUILD_RECORDS_DIR, record())
    assert lock() == 0  # nothing rejected: results/build-records/ holds no results
    compat = load_lockfile(workdir / "compat.lock.json")
    assert not compat.rejected_results
    build = compat.by_id()[BUILT].source_build
    assert (
        build is not None and build.record == f"{BUILD_RECORDS_DIR.as_posix()}/{record_name(BUILT)}"
    )
    # the last build beside the locks comes first
    write_record(workdir / "locks", record(key="f" * 64))
    assert lock() == 0
    build = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT].source_build
    assert build is not None and build.key == "f" * 64
    # --build-records names where to look instead
    assert lock("--build-records", str(BUILD_RECORDS_DIR)) == 0
    build = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT].source_build
    assert build is not None and build.key == KEY


def test_an_older_key_format_is_said(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = {"format": 1, "sdist_sha256": SDIST, "arch_list": ["9.0"]}
    write_record(workdir / "locks", record(key_inputs=inputs))
    assert lock() == 0
    capsys.readouterr()
    assert main(["query", BUILT]) == 0
    out = capsys.readouterr().out
    assert "; recorded by an earlier envbuilder (its sha256 still pins the wheel)" in out
    assert "recipe" not in out and "key format" not in out  # no maintainer words


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"key_inputs": {"format": 2, "sdist_sha256": "b" * 64, "arch_list": ["9.0"]}},
            f"built from the sdist with sha256 '{'b' * 64}', not the locked xformers-0.0.35.tar.gz",
        ),
        (
            {"key_inputs": {"format": 2, "sdist_sha256": SDIST, "arch_list": ["8.0"]}},
            "built for the architectures ['8.0'], not the locked ['9.0']",
        ),
        ({"combination": "py3.11-default-torch2.9.0"}, "it is the build of 'py3.11-default"),
        ({"schema": "envbuilder.source-build/9"}, "schema 'envbuilder.source-build/9'"),
        ({"wheel": {"filename": "x.whl", "sha256": "nope"}}, "wheel.sha256 'nope' is not a sha256"),
        ({"mode": "magic"}, "mode 'magic' is not one of in-place, docker"),
    ],
)
def test_a_record_of_another_build_is_refused_with_nothing_written(
    workdir: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    path = write_record(workdir / "locks", record(**changes))
    assert lock() == 2
    err = capsys.readouterr().err
    assert f"{path.relative_to(workdir)}: not a build record of {BUILT}" in err
    assert message in err and f"build again: envbuilder build-wheel {BUILT}" in err
    assert "Traceback" not in err
    assert not (workdir / "compat.lock.json").exists()


def test_an_unreadable_record_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "locks" / record_name(BUILT)).write_text("{not json")
    assert lock() == 2
    assert "cannot read the build record of" in capsys.readouterr().err


def test_the_committed_h200_record_is_a_build_record_of_its_row() -> None:
    (path,) = (ROOT / BUILD_RECORDS_DIR).glob("build-record.*.json")
    data = json.loads(path.read_text())
    assert path.name == record_name(data["combination"])
    assert data["schema"] == RECORD_SCHEMA and data["wheel"]["filename"].endswith(".whl")
    # made by the current recipe (the H200 rebuild of suite 3.0.0's runs)
    assert data["key_inputs"]["format"] == KEY_FORMAT
    assert data["wheel"]["libraries"]["xformers/_C.so"] and len(data["key"]) == 64


LIBRARY = "10452ccb0e4f41f4b2bbdf70991b63cbab740768508b87bcf3410be688dc85e7"
RECORD_LINES = (
    "xformers/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
    "xformers/_C.so,sha256=EEUsyw5PQfSyu99wmRtjy6t0B2hQi4e880EL5ojchec,7655840\n"
    "xformers/_C_flashattention3.cpython-312-x86_64-linux-gnu.so.1,sha256=bad,3\n"
    "xformers-0.0.35.dist-info/RECORD,,\n"
)


def test_the_record_names_each_compiled_library_by_its_sha256() -> None:
    # the H200 wheel's RECORD line for _C.so; a hash that is no sha256 is left out
    assert record_libraries(RECORD_LINES) == {"xformers/_C.so": LIBRARY}


def test_the_installed_xformers_libraries_come_from_its_dist_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "xformers-0.0.35.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.35\n")
    (info / "RECORD").write_text(RECORD_LINES)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_libraries("xformers") == {"xformers/_C.so": LIBRARY}
    assert installed_libraries("no-such-project-here") is None


def with_libraries(workdir: Path, libraries: object) -> Path:
    path = workdir / "results" / f"{BUILT}.h100.json"
    data = json.loads(path.read_text())
    data["runner"]["xformers_libraries"] = libraries
    path.write_text(json.dumps(data))
    return path


def test_a_run_of_another_build_than_the_record_is_rejected(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = record()["wheel"] | {"libraries": {"xformers/_C.so": LIBRARY}}
    write_record(workdir / "locks", record(wheel=wheel))
    with_libraries(workdir, {"xformers/_C.so": LIBRARY})
    assert lock() == 0  # the run measured the recorded wheel
    build = load_lockfile(workdir / "compat.lock.json").by_id()[BUILT].source_build
    assert build is not None and build.wheel_libraries == {"xformers/_C.so": LIBRARY}
    path = with_libraries(workdir, {"xformers/_C.so": "9" * 64})
    (workdir / "compat.lock.json").unlink()
    assert lock() == 2
    err = capsys.readouterr().err
    assert f"{path.name}" in err and (
        f"xformers' xformers/_C.so has sha256 999999999999…, not the built wheel's "
        f"{LIBRARY[:12]}… (its build record): the run measured another build"
    ) in " ".join(err.split())
    assert not (workdir / "compat.lock.json").exists()
    # a run that did not record its libraries (an older suite) is not compared
    with_libraries(workdir, None)
    assert lock() == 0


def fake_wheel(directory: Path, content: bytes = b"a built xformers wheel") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "xformers-0.0.35-py39-none-linux_x86_64.whl"
    path.write_bytes(content)
    return path


def locked_with_wheel(workdir: Path, wheel: Path) -> None:
    """A lockfile whose BUILT entry records *wheel* as its build."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    data = record()
    data["wheel"] = {"filename": wheel.name, "sha256": digest, "size": wheel.stat().st_size}
    write_record(workdir / "locks", data)
    assert lock() == 0


def install(*args: str) -> int:
    argv = ["install", BUILT, "--allow-unverified", "--lock", "compat.lock.json", *args]
    return main([*argv, "--build-cache", "cache"])


def test_install_puts_the_recorded_wheel_in_after_the_lock(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = fake_wheel(workdir / "cache" / KEY)
    locked_with_wheel(workdir, wheel)
    capsys.readouterr()
    assert install("--dry-run", "--installer", "pip") == 0
    commands = [line for line in capsys.readouterr().err.splitlines() if "pip install" in line]
    assert len(commands) == 2 and "--require-hashes" in commands[0]
    assert "-m pip install --no-deps --no-index " in commands[1]
    assert commands[1].endswith(f"/{wheel.name}")  # a checked copy of it
    # --wheel names it anywhere
    elsewhere = fake_wheel(workdir / "downloads")
    assert install("--dry-run", "--installer", "pip", "--wheel", str(elsewhere)) == 0


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("missing", "holds no such wheel: pass --wheel PATH of the recorded wheel"),
        ("other", "not the {sha} that the lockfile's build record of"),
    ],
)
def test_install_without_the_recorded_wheel_says_how_to_get_it_and_creates_nothing(
    workdir: Path, capsys: pytest.CaptureFixture[str], where: str, message: str
) -> None:
    wheel = fake_wheel(workdir / "cache" / KEY)
    locked_with_wheel(workdir, wheel)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if where == "missing":
        wheel.unlink()
    else:
        wheel.write_bytes(b"a rebuild: other bytes")
    capsys.readouterr()
    assert install("--venv", "env") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message.format(sha=sha) in err
    assert f"or build one with `envbuilder build-wheel {BUILT}`" in err
    assert "Nothing was installed" in err
    assert not (workdir / "env").exists()


def test_install_of_a_source_build_never_built_says_to_build_it(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock() == 0
    capsys.readouterr()
    assert install("--venv", "env") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"not built yet): build it with `envbuilder build-wheel {BUILT}`" in err
    assert not (workdir / "env").exists()


def test_a_wheel_for_a_combination_without_a_source_build_is_refused(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lock() == 0
    wheel = fake_wheel(workdir / "downloads")
    argv = ["install", "py3.11-default-torch2.5.1-xformers0.0.28.post3", "--dry-run"]
    assert main([*argv, "--lock", "compat.lock.json", "--wheel", str(wheel)]) == 2
    assert "not from a source build; leave --wheel out" in capsys.readouterr().err
