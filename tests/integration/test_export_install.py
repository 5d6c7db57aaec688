"""envbuilder export / install for real: wheels built here, served on loopback, locked by uv,
merged by envbuilder lock, then installed into fresh venvs by uv (pylock) and pip
(--require-hashes requirements)."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from envbuilder.cli import main

UV = str(Path(sys.executable).with_name("uv"))
VERIFIED = "py3.11-cpu-demo"
UNVERIFIED = "py3.11-cpu-demo-unverified"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def build_wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envbuilder-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return wheel


@pytest.fixture(scope="module")
def wheel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A find-links page on loopback (the directory listing of real wheels)."""
    root = tmp_path_factory.mktemp("wheels")
    build_wheel(root, "envb-demo-a", "1.0", ["envb-demo-b==2.0"])
    build_wheel(root, "envb-demo-b", "2.0", [])
    # a newer b and a user's project that takes any b: only constraints keep b at 2.0
    build_wheel(root, "envb-demo-b", "3.0", [])
    build_wheel(root, "envb-demo-user", "0.1", ["envb-demo-b>=2"])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()


def results_file(combination: str, lock_sha256: str, python: str = PY) -> dict[str, object]:
    check = {
        "group": "attention",
        "name": "attention.cpu.sdpa",
        "status": "pass",
        "reason": "",
        "gate": True,
        "impl": "sdpa",
        "workaround": None,
        "numbers": {},
        "duration_s": 0.1,
    }
    return {
        "schema": "envbuilder.results/1",
        "suite_version": "1.0.0",
        "combination": combination,
        "lock_sha256": lock_sha256,
        "started": "2026-11-20T00:00:00Z",
        "finished": "2026-11-20T00:00:01Z",
        "runner": {
            "hostname": "h",
            "platform": "Linux",
            "python": python,  # the combination's: lock checks a run against its claim
            "torch": "none",
            "torch_cuda": None,
            "xformers": None,
            "driver": None,
            "gpus": [],
        },
        "checks": [check],
    }


def make_repo(
    root: Path,
    locks: dict[str, list[str]],
    verified: set[str],
    *extra: str,
    python: str = PY,
) -> Path:
    """A repository with locks/ (made by uv), results/ and compat.lock.json (made by envbuilder),
    its combinations for Python ``python``."""
    (root / "locks").mkdir(parents=True)
    (root / "results").mkdir()
    records = []
    for cid, uv_args in locks.items():
        # uv writes only pylock.toml / pylock.<name-without-dots>.toml; the resolver names it by id
        made = root / "pylock.toml"
        subprocess.run(
            [
                UV,
                "pip",
                "compile",
                "--quiet",
                "--format",
                "pylock.toml",
                "--generate-hashes",
                "--python-version",
                python,
                *uv_args,
                "-o",
                str(made),
            ],
            check=True,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )
        pylock = made.replace(root / "locks" / f"pylock.{cid}.toml")
        sha = hashlib.sha256(pylock.read_bytes()).hexdigest()
        records.append(
            {
                "id": cid,
                "status": "resolved",
                "reason": "",
                "python": python,
                "cuda": "cpu",
                "platform": "manylinux_2_28_x86_64",
                "lock": f"locks/pylock.{cid}.toml",
                "lock_sha256": sha,
            }
        )
        if cid in verified:
            (root / "results" / f"{cid}.json").write_text(
                json.dumps(results_file(cid, sha, python))
            )
    (root / "locks" / "resolution.json").write_text(
        json.dumps(
            {
                "schema": "envbuilder.resolution/1",
                "matrix": "matrix.toml",
                "matrix_sha256": "0" * 64,
                "combinations": records,
            }
        )
    )
    assert (
        main(
            [
                "lock",
                "--resolution",
                str(root / "locks" / "resolution.json"),
                "--results",
                str(root / "results"),
                "-o",
                str(root / "compat.lock.json"),
            ]
        )
        == 0
    )
    return root / "compat.lock.json"


@pytest.fixture(scope="module")
def demo_lock(tmp_path_factory: pytest.TempPathFactory, wheel_server: str) -> Path:
    root = tmp_path_factory.mktemp("repo")
    req = root / "demo.in"
    req.write_text("envb-demo-a\n")
    args = ["--no-index", "--find-links", wheel_server, str(req)]
    return make_repo(root, {VERIFIED: args, UNVERIFIED: args}, {VERIFIED})


def fresh_venv(path: Path, *, pip: bool) -> Path:
    cmd = (
        [sys.executable, "-m", "venv", str(path)]
        if pip
        else [UV, "venv", "-q", "--python", sys.executable, str(path)]
    )
    subprocess.run(cmd, check=True)
    return path / "bin" / "python"


def installed(python: Path, *names: str) -> list[str]:
    code = "import importlib.metadata as m, sys; print(*(m.version(n) for n in sys.argv[1:]))"
    out = subprocess.run(
        [str(python), "-c", code, *names], check=True, capture_output=True, text=True
    )
    return out.stdout.split()


def export_requirements(combination: str, lock: Path, out: Path) -> None:
    """``envbuilder export COMBINATION --format requirements -o OUT --lock LOCK`` succeeds."""
    argv = ["export", combination, "--format", "requirements", "-o", str(out), "--lock", str(lock)]
    assert main(argv) == 0


def test_exported_pylock_installs_with_uv(demo_lock: Path, tmp_path: Path) -> None:
    out = tmp_path / "pylock.demo.toml"
    assert (
        main(["export", VERIFIED, "--format", "pylock", "-o", str(out), "--lock", str(demo_lock)])
        == 0
    )
    python = fresh_venv(tmp_path / "venv", pip=False)
    subprocess.run([UV, "pip", "install", "--python", str(python), "-r", str(out)], check=True)
    assert installed(python, "envb-demo-a", "envb-demo-b") == ["1.0", "2.0"]


def test_exported_requirements_install_with_pip_require_hashes(
    demo_lock: Path, tmp_path: Path
) -> None:
    out = tmp_path / "requirements.txt"
    export_requirements(VERIFIED, demo_lock, out)
    text = out.read_text()
    assert text.count("--hash=sha256:") == 2
    python = fresh_venv(tmp_path / "venv", pip=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(out)], check=True
    )
    assert installed(python, "envb-demo-a", "envb-demo-b") == ["1.0", "2.0"]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_exported_constraints_keep_the_verified_stack_beside_ones_own(
    demo_lock: Path, wheel_server: str, tmp_path: Path, installer: str
) -> None:
    """``install -c constraints.txt -r my-requirements.txt``: the user's project is added,
    the lock's closure keeps its versions though the index has a newer one."""
    out = tmp_path / "constraints.txt"
    argv = ["export", VERIFIED, "--format", "constraints", "-o", str(out), "--lock", str(demo_lock)]
    assert main(argv) == 0
    assert [line for line in out.read_text().splitlines() if not line.startswith("#")] == [
        "envb-demo-a==1.0",
        "envb-demo-b==2.0",
    ]
    mine = tmp_path / "my-requirements.txt"
    mine.write_text("envb-demo-user\n")
    source = ["--no-index", "--find-links", wheel_server]
    for constraints, b in (([], "3.0"), (["-c", str(out)], "2.0")):
        venv = tmp_path / f"venv{len(constraints)}"
        python = fresh_venv(venv, pip=installer == "pip")
        if installer == "uv":
            cmd = [UV, "pip", "install", "-q", "--python", str(python)]
        else:
            cmd = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*cmd, *source, *constraints, "-r", str(mine)], check=True)
        assert installed(python, "envb-demo-user", "envb-demo-b") == ["0.1", b]


def test_a_changed_wheel_hash_is_refused_by_pip(demo_lock: Path, tmp_path: Path) -> None:
    out = tmp_path / "requirements.txt"
    export_requirements(VERIFIED, demo_lock, out)
    first = out.read_text().split("--hash=sha256:")[1][:64]
    out.write_text(out.read_text().replace(first, "0" * 64))
    python = fresh_venv(tmp_path / "venv", pip=True)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "HASHES" in result.stderr.upper()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_into_a_new_venv(
    demo_lock: Path, tmp_path: Path, installer: str, capfd: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    assert (
        main(
            [
                "install",
                VERIFIED,
                "--venv",
                str(venv),
                "--installer",
                installer,
                "--lock",
                str(demo_lock),
            ]
        )
        == 0
    )
    assert installed(venv / "bin" / "python", "envb-demo-a") == ["1.0"]
    said = capfd.readouterr()
    assert "experimental" not in said.out + said.err  # uv's pylock preview warning


def test_install_refuses_unverified_unless_allowed(
    demo_lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    assert main(["install", UNVERIFIED, "--venv", str(venv), "--lock", str(demo_lock)]) == 2
    assert "--allow-unverified" in capsys.readouterr().err
    assert not venv.exists()
    assert (
        main(
            [
                "install",
                UNVERIFIED,
                "--venv",
                str(venv),
                "--allow-unverified",
                "--lock",
                str(demo_lock),
            ]
        )
        == 0
    )
    assert installed(venv / "bin" / "python", "envb-demo-b") == ["2.0"]


def copy_repo(lock: Path, root: Path) -> Path:
    """A copy of the lockfile and its locks/, to damage; returns the copied lockfile."""
    (root / "locks").mkdir(parents=True)
    for p in (lock.parent / "locks").iterdir():
        (root / "locks" / p.name).write_bytes(p.read_bytes())
    (root / "compat.lock.json").write_bytes(lock.read_bytes())
    return root / "compat.lock.json"


def test_export_refuses_a_pylock_changed_after_locking(
    demo_lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = copy_repo(demo_lock, tmp_path / "copy")
    pylock = lock.parent / "locks" / f"pylock.{VERIFIED}.toml"
    pylock.write_text(pylock.read_text().replace("envb-demo-b", "envb-demo-c"))
    out = tmp_path / "pylock.toml"
    assert main(["export", VERIFIED, "-o", str(out), "--lock", str(lock)]) == 2
    assert "was changed after the lockfile was made" in capsys.readouterr().err
    assert not out.exists()


def _pylock_changed(lock: Path, venv: Path) -> None:
    pylock = lock.parent / "locks" / f"pylock.{VERIFIED}.toml"
    pylock.write_text(pylock.read_text().replace("envb-demo-b", "envb-demo-c"))


def _pylock_missing(lock: Path, venv: Path) -> None:
    (lock.parent / "locks" / f"pylock.{VERIFIED}.toml").unlink()


def _venv_is_something_else(lock: Path, venv: Path) -> None:
    venv.mkdir()
    (venv / "notes.txt").write_text("mine")


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_pylock_changed, "was changed after the lockfile was made"),
        (_pylock_missing, "the lock of 'py3.11-cpu-demo' is missing"),
        (_venv_is_something_else, "exists and is not a virtual environment"),
    ],
)
def test_install_verifies_everything_before_creating_the_venv(
    demo_lock: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    installer: str,
    damage: Callable[[Path, Path], None],
    message: str,
) -> None:
    lock = copy_repo(demo_lock, tmp_path / "copy")
    venv = tmp_path / "venv"
    damage(lock, venv)
    before = sorted(p.name for p in venv.iterdir()) if venv.exists() else None
    argv = ["install", VERIFIED, "--venv", str(venv), "--installer", installer]
    assert main([*argv, "--lock", str(lock)]) == 2
    assert message in capsys.readouterr().err
    assert (sorted(p.name for p in venv.iterdir()) if venv.exists() else None) == before


#: A Python that uv finds nowhere on this machine (checked; the tests skip where it does).
ABSENT_PYTHON = "3.15"
ABSENT = "py3.15-cpu-demo"


@pytest.fixture(scope="module")
def absent_python_lock(tmp_path_factory: pytest.TempPathFactory, wheel_server: str) -> Path:
    found = subprocess.run(
        [UV, "python", "find", ABSENT_PYTHON],
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    if found.returncode == 0:
        pytest.skip(f"uv finds a Python {ABSENT_PYTHON} here ({found.stdout.strip()})")
    root = tmp_path_factory.mktemp("absent")
    req = root / "demo.in"
    req.write_text("envb-demo-a\n")
    args = ["--no-index", "--find-links", wheel_server, str(req)]
    return make_repo(root, {ABSENT: args}, {ABSENT}, python=ABSENT_PYTHON)


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_says_which_python_it_needs_when_uv_finds_none(
    absent_python_lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], installer: str
) -> None:
    venv = tmp_path / "venv"
    argv = ["install", ABSENT, "--venv", str(venv), "--installer", installer]
    assert main([*argv, "--lock", str(absent_python_lock)]) == 3
    err = capsys.readouterr().err
    assert f"{ABSENT!r} needs Python {ABSENT_PYTHON}, and uv finds none" in err
    assert f"uv python install {ABSENT_PYTHON}" in err and "--python" in err
    assert "Traceback" not in err and "CalledProcessError" not in err
    assert not venv.exists()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_says_which_python_it_needs_when_given_another(
    absent_python_lock: Path, capsys: pytest.CaptureFixture[str], installer: str
) -> None:
    argv = ["install", ABSENT, "--python", sys.executable, "--installer", installer]
    assert main([*argv, "--lock", str(absent_python_lock)]) == 2
    err = capsys.readouterr().err
    assert f"{sys.executable} is Python {PY}, but {ABSENT!r} needs Python {ABSENT_PYTHON}" in err
    assert f"uv python install {ABSENT_PYTHON}" in err


def test_install_with_pip_says_how_to_get_pip_when_the_python_has_none(
    demo_lock: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = fresh_venv(tmp_path / "venv", pip=False)  # uv's venvs come without pip
    argv = ["install", VERIFIED, "--python", str(python), "--installer", "pip"]
    assert main([*argv, "--lock", str(demo_lock)]) == 3
    err = capsys.readouterr().err
    assert f"pip is not installed in {python}" in err
    assert "-m ensurepip" in err and "--installer uv" in err


def pip_find_links() -> list[str]:
    value = (
        os.environ.get("PIP_FIND_LINKS")
        or subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
        ).stdout
    )
    return value.split()


@pytest.mark.slow
def test_torch_cpu_combination_installs_with_uv_and_pip(tmp_path: Path) -> None:
    """The real torch 2.13.0 CPU build from pip's configured find-links, plus its dependencies
    from the configured index."""
    links = [
        d for d in pip_find_links() if Path(d).is_dir() and list(Path(d).glob("torch-2.13.0*.whl"))
    ]
    if not links:
        pytest.skip("no torch 2.13.0 wheel in pip's configured find-links")
    req = tmp_path / "torch.in"
    req.write_text("torch==2.13.0\n")
    uv_args = [a for d in links for a in ("--find-links", d)] + ["--only-binary", ":all:", str(req)]
    lock = make_repo(
        tmp_path / "repo", {"py3.11-cpu-torch2.13.0": uv_args}, {"py3.11-cpu-torch2.13.0"}
    )
    pylock = tmp_path / "pylock.torch.toml"
    reqs = tmp_path / "requirements.txt"
    assert main(["export", "py3.11-cpu-torch2.13.0", "-o", str(pylock), "--lock", str(lock)]) == 0
    export_requirements("py3.11-cpu-torch2.13.0", lock, reqs)
    uv_python = fresh_venv(tmp_path / "uv-venv", pip=False)
    subprocess.run(
        [UV, "pip", "install", "--python", str(uv_python), "-r", str(pylock)], check=True
    )
    pip_python = fresh_venv(tmp_path / "pip-venv", pip=True)
    subprocess.run(
        [str(pip_python), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(reqs)],
        check=True,
    )
    for python in (uv_python, pip_python):
        assert installed(python, "torch")[0].startswith("2.13.0")
