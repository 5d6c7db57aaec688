"""envbuilder doctor against the environment running the tests: a lockfile whose combination is
this environment's torch closure (locked by uv from the configured index and find-links) passes;
one that pins another version of a dependency fails."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

UV = str(Path(sys.executable).with_name("uv"))
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def find_links() -> list[str]:
    value = (
        os.environ.get("PIP_FIND_LINKS")
        or subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
        ).stdout
    )
    return [d for d in value.split() if Path(d).is_dir()]


def make_lockfile(root: Path, torch: str, *, pin: str | None = None) -> Path:
    """*pin* (``name==version``) replaces the installed version in the lock's constraints."""
    cid = f"py{PY}-cpu-torch{torch.split('+')[0]}"
    (root / "locks").mkdir(parents=True)
    (root / "results").mkdir()
    installed = sorted(
        {
            f"{d.metadata['Name']}=={d.version}"
            for d in metadata.distributions()
            if d.metadata["Name"]
        }
    )
    if pin:
        name = pin.split("==")[0].lower()
        installed = [r for r in installed if r.split("==")[0].lower() != name] + [pin]
    (root / "constraints.txt").write_text(
        "\n".join(r for r in installed if not r.lower().startswith("gpu-envbuilder")) + "\n"
    )
    (root / "torch.in").write_text(f"torch=={torch.split('+')[0]}\n")
    links = [a for d in find_links() for a in ("--find-links", d)]
    made = root / "pylock.toml"
    subprocess.run(
        [
            UV,
            "pip",
            "compile",
            "-q",
            "--format",
            "pylock.toml",
            "--generate-hashes",
            "--only-binary",  # envbuilder's lock readers refuse sdists
            ":all:",
            "--python-version",
            PY,
            *links,
            "-c",
            str(root / "constraints.txt"),
            str(root / "torch.in"),
            "-o",
            str(made),
        ],
        check=True,
    )
    pylock = made.replace(root / "locks" / f"pylock.{cid}.toml")
    sha = hashlib.sha256(pylock.read_bytes()).hexdigest()
    (root / "locks" / "resolution.json").write_text(
        json.dumps(
            {
                "schema": "envbuilder.resolution/1",
                "matrix": "m",
                "matrix_sha256": "0" * 64,
                "combinations": [
                    {
                        "id": cid,
                        "status": "resolved",
                        "reason": "",
                        "python": PY,
                        "cuda": "cpu",
                        "platform": "manylinux_2_28_x86_64",
                        "lock": f"locks/pylock.{cid}.toml",
                        "lock_sha256": sha,
                        "requested": {"torch": torch.split("+")[0], "xformers": None},
                    }
                ],
            }
        )
    )
    check = {
        "group": "attention",
        "name": "attention.cpu",
        "status": "pass",
        "reason": "",
        "gate": True,
        "impl": "sdpa",
        "workaround": None,
        "numbers": {},
        "duration_s": 0.1,
    }
    (root / "results" / "r.json").write_text(
        json.dumps(
            {
                "schema": "envbuilder.results/1",
                "suite_version": "1.0.0",
                "combination": cid,
                "lock_sha256": sha,
                "started": "2026-11-29T00:00:00Z",
                "finished": "2026-11-29T00:00:01Z",
                "runner": {
                    "hostname": "h",
                    "platform": "Linux",
                    "python": PY,
                    "torch": torch,
                    "torch_cuda": None,
                    "xformers": None,
                    "driver": None,
                    "gpus": [],
                },
                "checks": [check],
            }
        )
    )
    envbuilder = [sys.executable, "-m", "envbuilder"]
    subprocess.run(
        [*envbuilder, "lock", "--resolution", "locks/resolution.json", "--results", "results"],
        cwd=root,
        check=True,
    )
    return root / "compat.lock.json"


def doctor(lockfile: Path, *flags: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder",
            "doctor",
            "--json",
            *(flags or ("--no-hashes",)),
            "--lock",
            str(lockfile),
        ],
        capture_output=True,
        text=True,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch is not installed in the test environment")


@pytest.mark.slow
def test_doctor_passes_in_the_locked_environment(tmp_path: Path, torch_version: str) -> None:
    code, report = doctor(make_lockfile(tmp_path, torch_version))
    statuses = {f["name"]: f["status"] for f in report["findings"]}  # type: ignore[attr-defined]
    assert code == 0, report
    assert statuses["combination"] == statuses["versions"] == statuses["torch"] == "pass"


@pytest.mark.slow
def test_doctor_fails_when_a_locked_version_differs(tmp_path: Path, torch_version: str) -> None:
    other = "1.13.3" if metadata.version("sympy") != "1.13.3" else "1.14.0"
    code, report = doctor(make_lockfile(tmp_path, torch_version, pin=f"sympy=={other}"))
    versions = next(f for f in report["findings"] if f["name"] == "versions")  # type: ignore[attr-defined]
    assert code == 1 and versions["status"] == "fail" and "sympy" in versions["detail"]


@pytest.mark.slow
def test_doctor_hashes_every_locked_file_then_only_what_changed(
    tmp_path: Path, torch_version: str
) -> None:
    lockfile = make_lockfile(tmp_path, torch_version)

    def files_finding(*flags: str) -> str:
        code, report = doctor(lockfile, "--no-probe", *flags)
        found = next(f for f in report["findings"] if f["name"] == "installed-files")  # type: ignore[attr-defined]
        assert code == 0 and found["status"] == "pass", report
        detail: str = found["detail"]
        return detail

    first = files_finding("--rehash")  # whatever an earlier run remembered, hash it all
    checked = int(first.split()[0])
    assert checked > 1000 and f"{checked} hashed, 0 unchanged" in first
    assert f"0 hashed, {checked} unchanged" in files_finding()
