"""``envbuilder resolve`` against a loopback index of real (small) wheels, with real uv.

The index mimics the public one (torch pinning its CUDA runtime, xformers
carrying ``xformers/cpp_lib.json``) and a PyTorch-style per-CUDA index
(``<base>/<cuda>/<project>/``, ``torch-2.5.1+cu121-...`` wheels).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from packaging.pylock import is_valid_pylock_path

from envbuilder import cli
from envbuilder.errors import MissingToolError
from envbuilder.index.relay import UV_DOWNLOADS
from envbuilder.model import lock_filename, suite_lock_filename
from envbuilder.resolve.closure import find_uv
from tests.support.index_server import IndexedFile, IndexServer
from tests.support.wheels import BuiltWheel, build_wheel, cpp_lib_json

LINUX_X86 = 'platform_system == "Linux" and platform_machine == "x86_64"'
TORCH_SIZE = 3 * 2**20  # large enough that reading a whole wheel shows in the byte counts

OK = "py3.11-cu121-torch2.4.1-xformers0.0.28.post1"
PIN_MISMATCH = "py3.11-cu121-torch2.4.1-xformers0.0.26.post1"
TORCH_CUDA_MISMATCH = "py3.11-cu124-torch2.4.1"
MAJOR_MISMATCH = "py3.11-cu130-torch2.11.0-xformers0.0.35"
WITH_RUNTIME = "py3.11-cu130-torch2.11.0-xformers0.0.35-cudart"
PER_CUDA = "py3.11-cu121-torch2.5.1"


@pytest.fixture(scope="module")
def uv() -> str:
    try:
        return find_uv()
    except MissingToolError as e:
        pytest.skip(f"uv is needed for closures: {e}")


@dataclass(frozen=True, kw_only=True)
class Wheels:
    torch241: BuiltWheel
    torch2110: BuiltWheel
    torch251_cu121: BuiltWheel
    torch251_cu118: BuiltWheel
    xformers_ok: BuiltWheel
    xformers_old: BuiltWheel
    xformers_035: BuiltWheel
    runtime_121: BuiltWheel
    runtime_128: BuiltWheel
    toolkit_130: BuiltWheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    d = tmp_path_factory.mktemp("resolver-wheels")
    return Wheels(
        torch241=build_wheel(
            d,
            "torch",
            "2.4.1",
            tags="cp311-cp311-manylinux_2_28_x86_64",
            requires_dist=[f"nvidia-cuda-runtime-cu12==12.1.105; {LINUX_X86}"],
            padding=TORCH_SIZE,
        ),
        torch2110=build_wheel(
            d,
            "torch",
            "2.11.0",
            tags="cp311-cp311-manylinux_2_28_x86_64",
            requires_dist=['cuda-toolkit==13.0.2; platform_system == "Linux"'],
            padding=TORCH_SIZE,
            seed=1,
        ),
        torch251_cu121=build_wheel(
            d,
            "torch",
            "2.5.1+cu121",
            tags="cp311-cp311-linux_x86_64",
            requires_dist=[f"nvidia-cuda-runtime-cu12==12.1.105; {LINUX_X86}"],
        ),
        torch251_cu118=build_wheel(
            d,
            "torch",
            "2.5.1+cu118",
            tags="cp311-cp311-linux_x86_64",
            requires_dist=["nvidia-cuda-runtime-cu11==11.8.89"],
        ),
        xformers_ok=build_wheel(
            d,
            "xformers",
            "0.0.28.post1",
            tags="cp311-cp311-manylinux_2_28_x86_64",
            requires_dist=["torch==2.4.1"],
            members={
                "xformers/cpp_lib.json": cpp_lib_json(
                    torch="2.4.1+cu121", cuda=1201, arch_list="8.0 9.0+PTX"
                )
            },
            padding=2**20,
        ),
        xformers_old=build_wheel(
            d,
            "xformers",
            "0.0.26.post1",
            tags="cp311-cp311-manylinux2014_x86_64",
            requires_dist=["torch==2.3.0"],
            members={
                "xformers/cpp_lib.json": cpp_lib_json(
                    torch="2.3.0+cu121", cuda=1201, arch_list="8.0"
                )
            },
        ),
        xformers_035=build_wheel(
            d,
            "xformers",
            "0.0.35",
            tags="py39-none-manylinux_2_28_x86_64",
            requires_dist=["torch>=2.10"],
            members={
                "xformers/cpp_lib.json": cpp_lib_json(
                    torch="2.10.0+cu128", cuda=1208, arch_list="8.0 9.0 10.0+PTX"
                )
            },
            padding=2**20,
        ),
        runtime_121=build_wheel(
            d, "nvidia-cuda-runtime-cu12", "12.1.105", tags="py3-none-manylinux1_x86_64"
        ),
        runtime_128=build_wheel(
            d, "nvidia-cuda-runtime-cu12", "12.8.90", tags="py3-none-manylinux_2_27_x86_64"
        ),
        toolkit_130=build_wheel(d, "cuda-toolkit", "13.0.2", tags="py3-none-any"),
    )


def _default_projects(w: Wheels) -> dict[str, list[IndexedFile | BuiltWheel]]:
    return {
        "torch": [w.torch241, w.torch2110],
        "xformers": [w.xformers_ok, w.xformers_old, w.xformers_035],
        "nvidia-cuda-runtime-cu12": [w.runtime_121, w.runtime_128],
        "cuda-toolkit": [w.toolkit_130],
    }


def _server(w: Wheels, **switches: Any) -> IndexServer:
    server = IndexServer(**switches)
    server.add_index("simple", _default_projects(w))
    server.add_index("whl/cu121", {"torch": [w.torch251_cu121]})
    server.add_index("whl/cu118", {"torch": [w.torch251_cu118]})
    return server


@pytest.fixture
def server(wheels: Wheels) -> Iterator[IndexServer]:
    with _server(wheels) as s:
        yield s


MATRIX_ROWS = """
[axes]
python = ["3.11"]

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post1"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.26.post1"

[[combinations]]
python = "3.11"
cuda = "cu124"
torch = "2.4.1"

[[combinations]]
python = "3.11"
cuda = "cu130"
torch = "2.11.0"
xformers = "0.0.35"

[[combinations]]
python = "3.11"
cuda = "cu130"
torch = "2.11.0"
xformers = "0.0.35"
add-cuda-runtime = true

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.5.1"
torch-index = "pytorch"
"""


def _matrix(tmp_path: Path, default_url: str, pytorch_url: str, rows: str = MATRIX_ROWS) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(
        f'[indexes.default]\nurl = "{default_url}"\n\n'
        f'[indexes.pytorch]\nurl = "{pytorch_url}"\nprojects = ["torch"]\n' + rows,
        encoding="utf-8",
    )
    return path


@dataclass(frozen=True, kw_only=True)
class Run:
    rc: int
    doc: dict[str, Any]
    out: Path
    stderr: str

    def by_id(self) -> dict[str, dict[str, Any]]:
        return {c["combination"]["id"]: c for c in self.doc["combinations"]}

    def written(self) -> dict[str, dict[str, Any]]:
        data = json.loads((self.out / "resolution.json").read_text(encoding="utf-8"))
        return {c["combination"]["id"]: c for c in data["combinations"]}

    def lock(self, cid: str) -> dict[str, Any]:
        path = self.out.parent / self.by_id()[cid]["lock"]  # docs/contracts.md: take it from here
        return tomllib.loads(path.read_text(encoding="utf-8"))

    def locked(self, cid: str) -> dict[str, str]:
        return {p["name"]: p["version"] for p in self.lock(cid)["packages"]}


@pytest.fixture
def resolve(tmp_path: Path, capsys: pytest.CaptureFixture[str], uv: str) -> Iterator[Any]:
    """``resolve(matrix, *selectors, "--offline", ...)`` runs the CLI in-process."""

    def run(matrix: Path, *args: str, out: Path | None = None, cache: Path | None = None) -> Run:
        out = out or tmp_path / "locks"
        cache = cache or tmp_path / "cache"
        argv = ["resolve", "--matrix", str(matrix), "--out", str(out), "--cache-dir", str(cache)]
        rc = cli.main([*argv, "--json", "--jobs", "2", *args])
        captured = capsys.readouterr()
        if not captured.out:
            pytest.fail(f"envbuilder resolve printed no JSON (exit {rc}):\n{captured.err}")
        return Run(rc=rc, doc=json.loads(captured.out), out=out, stderr=captured.err)

    yield run


def _matrix_for(tmp_path: Path, server: IndexServer) -> Path:
    return _matrix(tmp_path, server.index_url("simple"), server.index_url("whl") + "/{cuda}")


# -- what the resolver decides ----------------------------------------------------------------


EXPECTED_STATUS = {
    OK: "resolved",
    PIN_MISMATCH: "unsatisfiable",
    TORCH_CUDA_MISMATCH: "unsatisfiable",
    MAJOR_MISMATCH: "unsatisfiable",
    WITH_RUNTIME: "resolved",
    PER_CUDA: "resolved",
}


@pytest.mark.parametrize(
    "switches",
    [
        pytest.param({"format": "json"}, id="json-page-metadata-advertised"),
        pytest.param({"format": "html"}, id="html-page-metadata-advertised"),
        pytest.param(
            {"format": "json", "advertise_metadata": False, "serve_metadata": False},
            id="json-page-range-fallback",
        ),
        pytest.param(
            {"format": "html", "advertise_metadata": False, "serve_metadata": True},
            id="html-page-metadata-unadvertised",
        ),
    ],
)
def test_every_combination_gets_its_status_and_reason(
    wheels: Wheels, tmp_path: Path, resolve: Any, switches: dict[str, Any]
) -> None:
    with _server(wheels, **switches) as server:
        run = resolve(_matrix_for(tmp_path, server))
        largest_response = max((r.body_bytes for r in server.stats.log), default=0)
        sent = server.stats.bytes_sent
        log = list(server.stats.log)
    results = run.by_id()
    assert {cid: r["status"] for cid, r in results.items()} == EXPECTED_STATUS

    # The evidence came the way the index offers it: PEP 658 files, else HTTP ranges.
    metadata_reads = [r for r in log if r.path.endswith(".metadata") and r.status == 200]
    range_reads = [r for r in log if r.status == 206]
    if switches.get("advertise_metadata", True):
        assert len(metadata_reads) >= 4  # torch 2.4.1, 2.11.0, 2.5.1+cu121, xformers ...
    else:
        assert metadata_reads == []
        assert len(range_reads) >= 4
    assert run.rc == 0

    # No whole torch or xformers wheel crossed the wire, whatever the index advertises.
    assert largest_response < wheels.xformers_ok.size // 4
    assert sent < wheels.torch241.size

    ok = results[OK]
    assert ok["torch"]["filename"] == wheels.torch241.filename
    assert ok["torch"]["sha256"] == wheels.torch241.sha256
    assert (ok["torch"]["cuda"], ok["torch"]["cuda_source"]) == ("12.1", "requires-dist")
    assert ok["xformers"]["built_with"] == {
        "torch": "2.4.1+cu121",
        "cuda": "12.1",
        "arch_list": "8.0 9.0+PTX",
    }
    assert ok["xformers"]["requires_torch"] == "==2.4.1"
    assert run.locked(OK) == {
        "nvidia-cuda-runtime-cu12": "12.1.105",
        "torch": "2.4.1",
        "xformers": "0.0.28.post1",
    }


def test_reasons_name_the_evidence(server: IndexServer, tmp_path: Path, resolve: Any) -> None:
    run = resolve(_matrix_for(tmp_path, server))
    results = run.by_id()

    pin = results[PIN_MISMATCH]["reason"]
    assert "torch==2.3.0" in pin and "2.4.1" in pin

    torch_cuda = results[TORCH_CUDA_MISMATCH]["reason"]
    assert "CUDA 12.1" in torch_cuda and "cu124" in torch_cuda

    major = results[MAJOR_MISMATCH]["reason"]
    assert "12.8" in major and "13.0" in major
    assert "add-cuda-runtime" in major

    for cid in (PIN_MISMATCH, TORCH_CUDA_MISMATCH, MAJOR_MISMATCH):
        assert results[cid]["lock"] is None
        assert not (run.out / lock_filename(cid)).exists()


def test_add_cuda_runtime_adds_the_runtime_xformers_was_built_for(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    run = resolve(_matrix_for(tmp_path, server), WITH_RUNTIME)
    result = run.by_id()[WITH_RUNTIME]
    assert result["status"] == "resolved"
    assert result["torch"]["cuda"] == "13.0"
    assert result["xformers"]["built_with"]["cuda"] == "12.8"
    assert result["extra_runtime"] == ["nvidia-cuda-runtime-cu12==12.8.90"]
    assert run.locked(WITH_RUNTIME) == {
        "cuda-toolkit": "13.0.2",
        "nvidia-cuda-runtime-cu12": "12.8.90",
        "torch": "2.11.0",
        "xformers": "0.0.35",
    }
    # Paths are relative to the output's parent (docs/contracts.md), not to the cwd.
    assert result["lock"] == f"locks/{lock_filename(WITH_RUNTIME)}"
    assert re.fullmatch(r"pylock\.[^.]+\.toml", Path(result["lock"]).name)  # PEP 751's name rule
    assert result["requirements"] == f"locks/requirements.{WITH_RUNTIME}.txt"
    lock_bytes = (run.out.parent / result["lock"]).read_bytes()
    assert hashlib.sha256(lock_bytes).hexdigest() == result["lock_sha256"]
    requirements = (run.out.parent / result["requirements"]).read_text(encoding="utf-8")
    assert (
        f"nvidia-cuda-runtime-cu12==12.8.90 \\\n    --hash=sha256:{server_sha(server, 'nvidia-cuda-runtime-cu12', '12.8.90')}"
        in requirements
    )


def server_sha(server: IndexServer, project: str, version: str) -> str:
    for files in server._indexes.values():
        for entry in files.get(project, []):
            if entry.wheel.version == version:
                return entry.wheel.sha256
    raise AssertionError(f"{project} {version} is not served")


def test_a_per_cuda_index_gives_torch_by_its_local_label(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    run = resolve(_matrix_for(tmp_path, server), PER_CUDA)
    result = run.by_id()[PER_CUDA]
    assert result["status"] == "resolved"
    torch = result["torch"]
    assert torch["filename"] == "torch-2.5.1+cu121-cp311-cp311-linux_x86_64.whl"
    assert (torch["cuda"], torch["cuda_source"], torch["index"]) == (
        "12.1",
        "local-label",
        "pytorch",
    )
    assert torch["url"].startswith(server.index_url("whl/cu121"))
    # torch's own dependencies come from the default index
    assert run.locked(PER_CUDA) == {"nvidia-cuda-runtime-cu12": "12.1.105", "torch": "2.5.1+cu121"}
    requirements = (run.out / f"requirements.{PER_CUDA}.txt").read_text(encoding="utf-8")
    assert f"--extra-index-url {server.index_url('whl/cu121')}\n" in requirements
    assert not any("/whl/cu118/" in path for path in server.stats.paths())


def test_torch_s_dependencies_may_come_from_the_per_cuda_index_itself(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    projects = _default_projects(wheels)
    del projects["nvidia-cuda-runtime-cu12"]  # only the PyTorch-style index has it
    with IndexServer() as server:
        server.add_index("simple", projects)
        server.add_index(
            "whl/cu121",
            {"torch": [wheels.torch251_cu121], "nvidia-cuda-runtime-cu12": [wheels.runtime_121]},
        )
        run = resolve(_matrix_for(tmp_path, server), PER_CUDA)
    assert run.by_id()[PER_CUDA]["status"] == "resolved"
    runtime = next(
        p for p in run.lock(PER_CUDA)["packages"] if p["name"] == "nvidia-cuda-runtime-cu12"
    )
    assert runtime["wheels"][0]["url"].startswith(server.index_url("whl/cu121"))
    assert runtime["wheels"][0]["hashes"]["sha256"] == wheels.runtime_121.sha256


MORE_ROWS = """
[axes]
python = ["3.11", "3.12"]

[[combinations]]
python = "3.11"
cuda = "default"
torch = "2.5.1"
xformers = "0.0.28.post3"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.2"

[[combinations]]
python = "3.12"
cuda = "cu121"
torch = "2.4.1"

[[combinations]]
python = "3.11"
cuda = "cpu"
torch = "2.4.1"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.99"
"""


@pytest.mark.parametrize(
    ("cid", "status", "evidence"),
    [
        ("py3.11-default-torch2.5.1-xformers0.0.28.post3", "resolved", ["CUDA minor versions differ", "12.1", "12.4"]),
        ("py3.11-cu121-torch2.4.2", "unsatisfiable", ["torch 2.4.2 is not on index 'default'", "2.4.1"]),
        ("py3.12-cu121-torch2.4.1", "unsatisfiable", ["no torch 2.4.1 wheel fits cp312", "the release has wheels for Python 3.11 on manylinux_2_28_x86_64"]),
        ("py3.11-cpu-torch2.4.1", "unsatisfiable", ["CUDA 12.1", "CPU build"]),
        ("py3.11-cu121-torch2.4.1-xformers0.0.99", "unsatisfiable", ["xformers 0.0.99 is not on index 'default'"]),
    ],
)  # fmt: skip
def test_more_outcomes_and_their_evidence(
    wheels: Wheels,
    tmp_path: Path,
    resolve: Any,
    cid: str,
    status: str,
    evidence: list[str],
) -> None:
    d = tmp_path / "more"
    torch251 = build_wheel(
        d,
        "torch",
        "2.5.1",
        tags="cp311-cp311-manylinux1_x86_64",
        requires_dist=[f"nvidia-cuda-runtime-cu12==12.4.127; {LINUX_X86}"],
    )
    xformers_post3 = build_wheel(
        d,
        "xformers",
        "0.0.28.post3",
        tags="cp311-cp311-manylinux_2_28_x86_64",
        requires_dist=["torch==2.5.1"],
        members={
            "xformers/cpp_lib.json": cpp_lib_json(torch="2.5.1+cu121", cuda=1201, arch_list="8.0")
        },
    )
    runtime_124 = build_wheel(
        d, "nvidia-cuda-runtime-cu12", "12.4.127", tags="py3-none-manylinux2014_x86_64"
    )
    projects = _default_projects(wheels)
    projects["torch"] = [*projects["torch"], torch251]
    projects["xformers"] = [*projects["xformers"], xformers_post3]
    projects["nvidia-cuda-runtime-cu12"] = [*projects["nvidia-cuda-runtime-cu12"], runtime_124]
    with IndexServer() as server:
        server.add_index("simple", projects)
        matrix = _matrix(
            tmp_path, server.index_url("simple"), server.url + "/whl/{cuda}", MORE_ROWS
        )
        run = resolve(matrix, cid)
    result = run.by_id()[cid]
    assert result["status"] == status
    said = " ".join([result["reason"], *result["notes"]])
    for text in evidence:
        assert text in said


@pytest.mark.parametrize(
    ("entries", "chosen", "note", "rejected"),
    [
        pytest.param(
            [("cp311-cp311-manylinux_2_28_x86_64", "broken build")],
            "xformers-0.0.28.post1-cp311-cp311-manylinux_2_28_x86_64.whl",
            "broken build",
            [],
            id="only-yanked-is-used-with-a-note",
        ),
        pytest.param(
            [("cp311-cp311-manylinux_2_28_x86_64", "broken build"), ("cp311-cp311-manylinux2014_x86_64", None)],
            "xformers-0.0.28.post1-cp311-cp311-manylinux2014_x86_64.whl",
            None,
            ["yanked (broken build)"],
            id="unyanked-preferred",
        ),
    ],
)  # fmt: skip
@pytest.mark.parametrize("page_format", ["json", "html"])
def test_a_yanked_file(
    wheels: Wheels,
    tmp_path: Path,
    resolve: Any,
    page_format: Literal["json", "html"],
    entries: list[tuple[str, str | None]],
    chosen: str,
    note: str | None,
    rejected: list[str],
) -> None:
    files: list[IndexedFile | BuiltWheel] = []
    for i, (tags, yanked) in enumerate(entries):
        wheel = build_wheel(
            tmp_path / f"yanked{i}",
            "xformers",
            "0.0.28.post1",
            tags=tags,
            requires_dist=["torch==2.4.1"],
            members={
                "xformers/cpp_lib.json": cpp_lib_json(torch="2.4.1", cuda=1201, arch_list="8.0")
            },
        )
        files.append(IndexedFile(wheel=wheel, yanked=yanked or False))
    with IndexServer(format=page_format) as server:
        server.add_index("simple", {**_default_projects(wheels), "xformers": files})
        run = resolve(_matrix_for(tmp_path, server), OK)
    result = run.by_id()[OK]
    assert result["status"] == "resolved"
    assert result["xformers"]["filename"] == chosen
    assert [r["reason"] for r in result["rejected"] if r["project"] == "xformers"] == rejected
    yanked_notes = [n for n in result["notes"] if "yanked" in n]
    if note is None:
        assert yanked_notes == []
    else:
        assert len(yanked_notes) == 1 and note in yanked_notes[0]


def test_an_unreadable_build_record_is_an_error_for_that_combination_only(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    broken = build_wheel(
        tmp_path / "broken",
        "xformers",
        "0.0.28.post1",
        tags="cp311-cp311-manylinux_2_28_x86_64",
        requires_dist=["torch==2.4.1"],
        members={"xformers/cpp_lib.json": b"{not json"},
    )
    with IndexServer() as server:
        server.add_index(
            "simple", {**_default_projects(wheels), "xformers": [broken, wheels.xformers_old]}
        )
        run = resolve(_matrix_for(tmp_path, server), OK, PIN_MISMATCH)
    results = run.by_id()
    assert results[OK]["status"] == "error"
    assert broken.filename in results[OK]["reason"] and "cpp_lib.json" in results[OK]["reason"]
    assert results[PIN_MISMATCH]["status"] == "unsatisfiable"
    assert run.rc == 1


# -- failures stay per combination ------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_index_is_an_error_and_the_rest_is_still_written(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}/whl/{{cuda}}"
    matrix = _matrix(tmp_path, server.index_url("simple"), dead)
    run = resolve(matrix, OK, PER_CUDA)
    assert run.rc == 1
    results = run.written()
    assert results[PER_CUDA]["status"] == "error"
    assert "127.0.0.1" in results[PER_CUDA]["reason"]
    assert results[OK]["status"] == "resolved"
    assert (run.out / lock_filename(OK)).is_file()
    assert (run.out / f"requirements.{OK}.txt").is_file()


def test_offline_works_from_the_cache_and_a_miss_is_an_error(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    matrix = _matrix_for(tmp_path, server)
    online = resolve(matrix, OK)
    assert online.by_id()[OK]["status"] == "resolved"
    server.stats.reset()

    offline = resolve(matrix, OK, PER_CUDA, "--offline", out=tmp_path / "offline-locks")
    assert server.stats.requests == 0
    results = offline.written()
    assert results[OK]["status"] == "resolved"
    assert results[OK]["lock_sha256"] == online.by_id()[OK]["lock_sha256"]
    assert results[PER_CUDA]["status"] == "error"
    assert "offline" in results[PER_CUDA]["reason"]
    assert offline.rc == 1


# -- stable, reproducible outputs -------------------------------------------------------------


def _uv_wrapper(tmp_path: Path, uv: str) -> tuple[Path, Path]:
    calls = tmp_path / "uv-calls"
    wrapper = tmp_path / "bin" / "uv"
    wrapper.parent.mkdir()
    record = 'echo "UV_CONCURRENT_DOWNLOADS=$UV_CONCURRENT_DOWNLOADS $@"'
    wrapper.write_text(f'#!/bin/sh\n{record} >> "{calls}"\nexec "{uv}" "$@"\n', encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper, calls


def _calls(path: Path) -> int:
    """The closures uv was asked to solve (``pip compile`` runs; not ``python find``)."""
    if not path.exists():
        return 0
    return sum(" pip compile " in line for line in path.read_text(encoding="utf-8").splitlines())


def test_a_rerun_is_byte_identical_keeps_locks_and_upgrade_re_resolves(
    server: IndexServer,
    tmp_path: Path,
    resolve: Any,
    uv: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    matrix = _matrix_for(tmp_path, server)

    first = resolve(matrix)
    resolved = [cid for cid, status in EXPECTED_STATUS.items() if status == "resolved"]
    uv_runs = _calls(calls)
    assert uv_runs >= 1
    snapshot = {p.name: p.read_bytes() for p in first.out.iterdir()}
    locks = sorted(p.name for p in first.out.glob("pylock.*.toml"))
    assert locks == sorted(lock_filename(cid) for cid in resolved)

    second = resolve(matrix)
    assert _calls(calls) == uv_runs, "an unchanged decision must not run uv again"
    assert {p.name: p.read_bytes() for p in second.out.iterdir()} == snapshot
    assert second.doc == first.doc

    upgraded = resolve(matrix, "--upgrade")
    assert _calls(calls) == 2 * uv_runs
    assert {p.name: p.read_bytes() for p in upgraded.out.iterdir()} == snapshot


def test_uv_builds_with_this_interpreter_and_asks_the_relay_many_at_once(
    server: IndexServer, tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv reads the index through the relay, which bounds what reaches the index: each uv
    run may ask the relay `UV_DOWNLOADS` things at once (2, the bound without a relay,
    made uv wait on loopback)."""
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    monkeypatch.delenv("UV_CONCURRENT_DOWNLOADS", raising=False)
    run = resolve(_matrix_for(tmp_path, server), OK)
    assert run.by_id()[OK]["status"] == "resolved"
    assert run.lock(OK)["requires-python"] == "==3.11.*"  # the target still comes from the matrix
    compiles = [c for c in calls.read_text(encoding="utf-8").splitlines() if " pip compile " in c]
    assert compiles and all(f"--python {sys.executable} " in c for c in compiles)
    assert all(c.startswith(f"UV_CONCURRENT_DOWNLOADS={UV_DOWNLOADS} ") for c in compiles)


@pytest.mark.parametrize(
    ("signum", "status"),
    [
        pytest.param(signal.SIGINT, 130, id="ctrl-c"),
        pytest.param(signal.SIGTERM, 128 + signal.SIGTERM, id="sigterm"),
    ],
)
def test_a_resolve_interrupted_while_uv_runs_leaves_nothing_in_tmpdir(
    server: IndexServer, tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    """uv's requirements, constraints and netrc go through pipes and its lock comes back on
    stdout: no ``$TMPDIR/envbuilder-uv-*`` folder that an interrupted run cannot remove."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    started = tmp_path / "uv-started"
    wrapper = tmp_path / "bin" / "uv"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\ntouch "{started}"\nexec sleep 60\n', encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    launcher = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import envbuilder.resolve.closure as closure\n"
        f"closure.find_uv = lambda: {str(wrapper)!r}\n"
        "from envbuilder import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", launcher, "resolve", OK, "--matrix"]
    argv += [str(_matrix_for(tmp_path, server)), "--out", str(tmp_path / "locks")]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(
        argv,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), f"uv never started (exit {proc.poll()})"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, stderr
    assert "interrupted" in stderr
    assert sorted(p.name for p in tmpdir.iterdir()) == []


def test_uv_is_told_the_interpreter_once_before_the_closures(
    server: IndexServer, tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    run = resolve(_matrix_for(tmp_path, server), OK)
    assert run.by_id()[OK]["status"] == "resolved"
    lines = calls.read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if " python find " in line] == [
        f"UV_CONCURRENT_DOWNLOADS= python find {sys.executable}"
    ]
    offline = tmp_path / "offline-calls"
    calls.rename(offline)
    resolve(_matrix_for(tmp_path, server), OK, "--offline")
    assert not calls.exists()  # offline runs no uv at all


def test_the_user_s_concurrent_downloads_win(
    server: IndexServer, tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    monkeypatch.setenv("UV_CONCURRENT_DOWNLOADS", "7")
    resolve(_matrix_for(tmp_path, server), OK)
    compiles = [c for c in calls.read_text(encoding="utf-8").splitlines() if " pip compile " in c]
    assert compiles and all(c.startswith("UV_CONCURRENT_DOWNLOADS=7 ") for c in compiles)


def test_a_changed_decision_relocks_that_combination(
    wheels: Wheels, tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    with _server(wheels) as server:
        matrix = _matrix_for(tmp_path, server)
        first = resolve(matrix, OK)
        assert _calls(calls) == 1
        rebuilt = build_wheel(
            tmp_path / "rebuilt",
            "xformers",
            "0.0.28.post1",
            tags="cp311-cp311-manylinux_2_28_x86_64",
            requires_dist=["torch==2.4.1"],
            members={
                "xformers/cpp_lib.json": cpp_lib_json(torch="2.4.1", cuda=1201, arch_list="9.0")
            },
        )
        server._indexes["simple"]["xformers"] = [IndexedFile(wheel=rebuilt)]
        second = resolve(matrix, OK, cache=tmp_path / "fresh-cache")
    assert _calls(calls) == 2
    assert second.by_id()[OK]["xformers"]["sha256"] == rebuilt.sha256
    assert second.by_id()[OK]["lock_sha256"] != first.by_id()[OK]["lock_sha256"]
    assert rebuilt.sha256 in (second.out / f"requirements.{OK}.txt").read_text(encoding="utf-8")


def test_outputs_are_readable_by_others(server: IndexServer, tmp_path: Path, resolve: Any) -> None:
    mask = os.umask(0o022)
    try:
        run = resolve(_matrix_for(tmp_path, server), OK)
    finally:
        os.umask(mask)
    for path in run.out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_an_index_without_metadata_or_ranges_is_an_error_not_a_whole_wheel_download(
    wheels: Wheels, tmp_path: Path, resolve: Any
) -> None:
    with _server(wheels, advertise_metadata=False, serve_metadata=False, ranges=False) as server:
        run = resolve(_matrix_for(tmp_path, server), OK)
    result = run.by_id()[OK]
    assert result["status"] == "error"
    assert wheels.torch241.filename in result["reason"] and "Range" in result["reason"]
    # What the client read (the server may have pushed more into socket buffers before the close).
    read = re.search(r"([\d.]+) MB in \d+ requests", run.stderr)
    assert read is not None, run.stderr
    assert float(read.group(1)) * 1e6 < wheels.torch241.size / 4
    assert run.rc == 1


def test_the_default_index_comes_from_pip_s_configuration(
    server: IndexServer, tmp_path: Path, resolve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", server.index_url("simple"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(  # no [indexes] at all
        '[[combinations]]\npython = "3.11"\ncuda = "cu121"\ntorch = "2.4.1"\n'
        'xformers = "0.0.28.post1"\n',
        encoding="utf-8",
    )
    run = resolve(matrix, OK)
    result = run.by_id()[OK]
    assert result["status"] == "resolved"
    assert result["torch"]["url"].startswith(server.index_url("simple"))
    assert run.lock(OK)["tool"]["envbuilder"]["indexes"] == [
        f"default {server.index_url('simple')}"
    ]


def test_transient_server_errors_are_retried(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    server.fail_next(2, 503)
    run = resolve(_matrix_for(tmp_path, server), OK)
    assert run.by_id()[OK]["status"] == "resolved"
    assert [r.status for r in server.stats.log[:2]] == [503, 503]


def test_one_pair_over_two_pythons_shares_one_uv_run_and_each_takes_its_part(
    tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    d = tmp_path / "pair"
    record = {"xformers/cpp_lib.json": cpp_lib_json(torch="2.4.1", cuda=1201, arch_list="8.0")}
    runtime = [f"nvidia-cuda-runtime-cu12==12.1.105; {LINUX_X86}"]
    only_311 = ['backport==1.0; python_version < "3.12"']
    projects: dict[str, list[IndexedFile | BuiltWheel]] = {
        "torch": [
            build_wheel(d, "torch", "2.4.1", tags=f"cp{v}-cp{v}-manylinux1_x86_64", requires_dist=runtime + only_311)
            for v in ("311", "312")
        ],
        "xformers": [
            build_wheel(d, "xformers", "0.0.28.post1", tags=f"cp{v}-cp{v}-manylinux_2_28_x86_64", requires_dist=["torch==2.4.1"], members=record)
            for v in ("311", "312")
        ],
        "nvidia-cuda-runtime-cu12": [build_wheel(d, "nvidia-cuda-runtime-cu12", "12.1.105", tags="py3-none-manylinux1_x86_64")],
        "backport": [build_wheel(d, "backport", "1.0")],
    }  # fmt: skip
    rows = """
[axes]
python = ["3.11", "3.12"]

[[pairs]]
torch = "2.4.1"
xformers = "0.0.28.post1"
cuda = "cu121"
"""
    with IndexServer() as server:
        server.add_index("simple", projects)
        run = resolve(_matrix(tmp_path, server.index_url("simple"), server.url + "/{cuda}", rows))
    py311, py312 = OK, OK.replace("py3.11", "py3.12")
    assert {cid: r["status"] for cid, r in run.by_id().items()} == {
        py311: "resolved",
        py312: "resolved",
    }
    assert _calls(calls) == 1
    assert run.locked(py311) == {
        "backport": "1.0",
        "nvidia-cuda-runtime-cu12": "12.1.105",
        "torch": "2.4.1",
        "xformers": "0.0.28.post1",
    }
    assert run.locked(py312) == {
        "nvidia-cuda-runtime-cu12": "12.1.105",
        "torch": "2.4.1",
        "xformers": "0.0.28.post1",
    }
    assert "cp312" in run.by_id()[py312]["torch"]["filename"]
    assert run.lock(py312)["requires-python"] == "==3.12.*"


# -- closures are content-addressed in the cache ------------------------------------------------


def test_a_fresh_out_with_a_warm_cache_reuses_the_solved_closures(
    server: IndexServer, tmp_path: Path, resolve: Any, uv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    matrix = _matrix_for(tmp_path, server)
    cold = resolve(matrix, out=tmp_path / "ci-1" / "locks")
    uv_runs = _calls(calls)
    assert uv_runs >= 1
    server.stats.reset()

    warm = resolve(matrix, out=tmp_path / "ci-2" / "locks")
    assert _calls(calls) == uv_runs, "a closure solved once must not be solved again"
    assert {p.name: p.read_bytes() for p in warm.out.iterdir()} == {
        p.name: p.read_bytes() for p in cold.out.iterdir()
    }

    upgraded = resolve(matrix, "--upgrade", out=tmp_path / "ci-3" / "locks")
    assert _calls(calls) == 2 * uv_runs
    assert upgraded.doc == cold.doc


def test_offline_into_a_new_out_without_a_cached_closure_is_the_documented_error(
    server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    matrix = _matrix_for(tmp_path, server)
    cache = tmp_path / "cache"
    online = resolve(matrix, OK, cache=cache)
    assert online.by_id()[OK]["status"] == "resolved"
    for solved in (cache / "closures", cache / "uv"):  # index pages stay cached, closures do not
        if solved.exists():
            shutil.rmtree(solved)

    offline = resolve(matrix, OK, "--offline", out=tmp_path / "new" / "locks", cache=cache)
    result = offline.by_id()[OK]
    assert offline.rc == 1
    assert result["status"] == "error"
    assert result["reason"].startswith("offline: no closure for this combination in the cache")
    assert "run once online" in result["reason"]
    assert "No solution found" not in offline.stderr
    assert "✓ resolve" not in offline.stderr and "✕ resolve" in offline.stderr
    assert not (offline.out / lock_filename(OK)).exists()


# -- a dependency that requires the pinned project back -----------------------------------------


TORCH_201 = "py3.11-cu117-torch2.0.1"


@pytest.mark.parametrize(
    ("requires_torch", "expected"),
    [
        pytest.param("torch", "resolved", id="same-release"),
        pytest.param("torch>=9", "error", id="another-release"),
    ],
)
def test_a_dependency_requiring_torch_itself(
    tmp_path: Path, resolve: Any, requires_torch: str, expected: str
) -> None:
    d = tmp_path / "wheels"
    torch = build_wheel(
        d,
        "torch",
        "2.0.1",
        tags="cp311-cp311-manylinux1_x86_64",
        requires_dist=[f"nvidia-cuda-runtime-cu11==11.7.99; {LINUX_X86}", f"triton==2.0.0; {LINUX_X86}", "filelock"],
    )  # fmt: skip
    newer = build_wheel(d, "torch", "2.1.0", tags="cp311-cp311-manylinux1_x86_64")
    projects: dict[str, list[IndexedFile | BuiltWheel]] = {
        "torch": [torch, newer],  # left alone, uv would take the newest torch for triton
        "triton": [
            build_wheel(d, "triton", "2.0.0", tags="cp311-cp311-manylinux2014_x86_64", requires_dist=[requires_torch, "filelock"])
        ],
        "filelock": [build_wheel(d, "filelock", "3.12.0")],
        "nvidia-cuda-runtime-cu11": [build_wheel(d, "nvidia-cuda-runtime-cu11", "11.7.99", tags="py3-none-manylinux1_x86_64")],
    }  # fmt: skip
    rows = '[[combinations]]\npython = "3.11"\ncuda = "cu117"\ntorch = "2.0.1"\n'
    with IndexServer() as server:
        server.add_index("simple", projects)
        run = resolve(_matrix(tmp_path, server.index_url("simple"), server.url + "/{cuda}", rows))
    result = run.by_id()[TORCH_201]
    assert result["status"] == expected, result["reason"]
    if expected == "resolved":
        lock = run.lock(TORCH_201)
        assert run.locked(TORCH_201) == {
            "filelock": "3.12.0",
            "nvidia-cuda-runtime-cu11": "11.7.99",
            "torch": "2.0.1",
            "triton": "2.0.0",
        }
        (torch_entry,) = [p for p in lock["packages"] if p["name"] == "torch"]
        assert torch_entry["wheels"][0]["hashes"]["sha256"] == torch.sha256
    else:
        assert "triton" in result["reason"] and "torch" in result["reason"]
        assert "pull in another torch" not in result["reason"]


# -- the conformance suite's own dependencies, a group beside each lock --------------------------


SUITE_PAIR = """
[axes]
python = ["3.11", "3.12"]

[[pairs]]
torch = "2.4.1"
xformers = "0.0.28.post1"
cuda = "cu121"

[[combinations]]
python = "3.11"
cuda = "cu124"
torch = "2.4.1"
"""


def _suite_projects(d: Path) -> dict[str, list[IndexedFile | BuiltWheel]]:
    """torch needs ``shared<2``; the suite's ``modelkit`` needs ``shared>=1`` (2.0 on its own)."""
    record = {"xformers/cpp_lib.json": cpp_lib_json(torch="2.4.1", cuda=1201, arch_list="8.0")}
    runtime = f"nvidia-cuda-runtime-cu12==12.1.105; {LINUX_X86}"
    return {
        "torch": [
            build_wheel(d, "torch", "2.4.1", tags=f"cp{v}-cp{v}-manylinux1_x86_64", requires_dist=[runtime, "shared<2"])
            for v in ("311", "312")
        ],
        "xformers": [
            build_wheel(d, "xformers", "0.0.28.post1", tags=f"cp{v}-cp{v}-manylinux_2_28_x86_64", requires_dist=["torch==2.4.1"], members=record)
            for v in ("311", "312")
        ],
        "nvidia-cuda-runtime-cu12": [build_wheel(d, "nvidia-cuda-runtime-cu12", "12.1.105", tags="py3-none-manylinux1_x86_64")],
        "shared": [build_wheel(d, "shared", "1.0"), build_wheel(d, "shared", "2.0")],
        "modelkit": [
            build_wheel(d, "modelkit", "1.0", requires_dist=["shared>=1", "helper"]),
            build_wheel(d, "modelkit", "2.0", requires_dist=["shared>=2", "helper"]),
        ],
        "helper": [build_wheel(d, "helper", "3.1")],
    }  # fmt: skip


@pytest.fixture
def suite_server(tmp_path: Path) -> Iterator[IndexServer]:
    with IndexServer() as server:
        server.add_index("simple", _suite_projects(tmp_path / "suite-wheels"))
        yield server


def _suite_matrix(tmp_path: Path, server: IndexServer, suite: str) -> Path:
    rows = SUITE_PAIR + f"\n[suite]\nrequirements = [{suite}]\n"
    return _matrix(tmp_path, server.index_url("simple"), server.url + "/{cuda}", rows)


def test_the_suite_group_is_locked_with_hashes_beside_the_lock_and_agrees_with_it(
    suite_server: IndexServer,
    tmp_path: Path,
    resolve: Any,
    uv: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    run = resolve(_suite_matrix(tmp_path, suite_server, '"modelkit"'))
    py311, py312 = OK, OK.replace("py3.11", "py3.12")
    assert {cid: r["status"] for cid, r in run.by_id().items()} == {
        py311: "resolved",
        py312: "resolved",
        TORCH_CUDA_MISMATCH: "unsatisfiable",
    }
    # One uv run for the pair's lock, one for the suite alone (modelkit 2.0 with shared 2.0,
    # which the lock does not have), one for the suite constrained by both locks.
    assert _calls(calls) == 3
    for cid in (py311, py312):
        entry = run.written()[cid]
        assert entry == run.by_id()[cid]
        assert entry["suite_lock"] == f"locks/{suite_lock_filename(cid)}"
        assert entry["suite_requirements"] == f"locks/requirements.{cid}.suite.txt"
        suite_path = run.out.parent / entry["suite_lock"]
        assert entry["suite_lock_sha256"] == hashlib.sha256(suite_path.read_bytes()).hexdigest()
        assert is_valid_pylock_path(suite_path)
        # The lock has shared 1.0 (torch needs <2); the suite takes that version, not 2.0,
        # and its group holds only what the lock does not.
        assert run.locked(cid)["shared"] == "1.0"
        suite = tomllib.loads(suite_path.read_text(encoding="utf-8"))
        assert {p["name"]: p["version"] for p in suite["packages"]} == {
            "helper": "3.1",
            "modelkit": "1.0",
        }
        assert all(re.fullmatch(r"[0-9a-f]{64}", w["hashes"]["sha256"]) for p in suite["packages"] for w in p["wheels"])  # fmt: skip
        assert suite["requires-python"] == f"=={entry['combination']['python']}.*"
        assert suite["tool"]["envbuilder"]["lock-sha256"] == entry["lock_sha256"]
        text = (run.out.parent / entry["suite_requirements"]).read_text(encoding="utf-8")
        assert re.findall(r"^(\S+==\S+) \\\n    --hash=sha256:[0-9a-f]{64}$", text, re.M) == [
            "helper==3.1",
            "modelkit==1.0",
        ]
    unsatisfiable = run.by_id()[TORCH_CUDA_MISMATCH]
    assert (unsatisfiable["suite_lock"], unsatisfiable["suite_requirements"]) == (None, None)
    assert unsatisfiable["suite_lock_sha256"] is None


def test_a_suite_group_is_kept_while_its_inputs_hold_and_upgrade_re_resolves_it(
    suite_server: IndexServer,
    tmp_path: Path,
    resolve: Any,
    uv: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    matrix = _suite_matrix(tmp_path, suite_server, '"modelkit"')
    first = resolve(matrix)
    snapshot = {p.name: p.read_bytes() for p in first.out.iterdir()}
    assert _calls(calls) == 3

    again = resolve(matrix)
    assert _calls(calls) == 3, "unchanged inputs: no uv run for the lock nor the suite"
    assert {p.name: p.read_bytes() for p in again.out.iterdir()} == snapshot

    fresh = resolve(matrix, out=tmp_path / "elsewhere" / "locks")
    assert _calls(calls) == 3, "the cache holds both groups"
    assert {p.name: p.read_bytes() for p in fresh.out.iterdir()} == {
        name: data for name, data in snapshot.items() if name != "resolution.json"
    } | {"resolution.json": (fresh.out / "resolution.json").read_bytes()}

    upgraded = resolve(matrix, "--upgrade")
    assert _calls(calls) == 6
    assert {p.name: p.read_bytes() for p in upgraded.out.iterdir()} == snapshot

    # Another suite requirement re-locks the suite group only; the lock stays.
    matrix = _suite_matrix(tmp_path, suite_server, '"modelkit==1.0"')
    changed = resolve(matrix)
    assert _calls(calls) == 8
    for cid in (OK, OK.replace("py3.11", "py3.12")):
        assert changed.by_id()[cid]["lock_sha256"] == first.by_id()[cid]["lock_sha256"]
        assert changed.by_id()[cid]["suite_lock_sha256"] != first.by_id()[cid]["suite_lock_sha256"]


def test_a_suite_agreeing_with_the_locks_on_its_own_takes_one_uv_run(
    suite_server: IndexServer,
    tmp_path: Path,
    resolve: Any,
    uv: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrapper, calls = _uv_wrapper(tmp_path, uv)
    monkeypatch.setattr("envbuilder.resolve.closure.find_uv", lambda: str(wrapper))
    run = resolve(_suite_matrix(tmp_path, suite_server, '"helper", "shared<2"'))
    assert _calls(calls) == 2
    for cid in (OK, OK.replace("py3.11", "py3.12")):
        suite = tomllib.loads((run.out.parent / run.by_id()[cid]["suite_lock"]).read_text())
        assert [(p["name"], p["version"]) for p in suite["packages"]] == [("helper", "3.1")]


def test_a_suite_that_needs_another_version_than_the_lock_is_an_error_naming_it(
    suite_server: IndexServer, tmp_path: Path, resolve: Any
) -> None:
    run = resolve(_suite_matrix(tmp_path, suite_server, '"modelkit==2.0"'), OK)
    (entry,) = run.doc["combinations"]
    assert entry["status"] == "error"
    assert entry["reason"].startswith(
        "suite group (modelkit==2.0) not locked: uv could not resolve"
    )
    assert "shared" in entry["reason"]
    assert run.rc == 1


def test_users_get_the_suite_group_only_with_with_suite(
    suite_server: IndexServer, tmp_path: Path, resolve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = resolve(_suite_matrix(tmp_path, suite_server, '"modelkit"'), OK)
    assert run.by_id()[OK]["status"] == "resolved"
    (tmp_path / "results").mkdir()
    lockfile = tmp_path / "compat.lock.json"
    made = ["lock", "--resolution", str(run.out / "resolution.json"), "--results", str(tmp_path / "results"), "-o", str(lockfile)]  # fmt: skip
    assert cli.main(made) == 0

    def export(*extra: str) -> str:
        capsys.readouterr()
        assert cli.main(["export", OK, "--lock", str(lockfile), *extra]) == 0
        return capsys.readouterr().out

    def names(text: str) -> list[str]:
        return re.findall(r"^([a-z0-9-]+)(?: @ |==)", text, re.M)

    stack = ["nvidia-cuda-runtime-cu12", "shared", "torch", "xformers"]
    assert names(export("--format", "requirements")) == stack
    assert names(export("--format", "constraints")) == stack
    with_suite = ["helper", "modelkit", *stack]
    assert names(export("--format", "requirements", "--with-suite")) == sorted(with_suite)
    assert names(export("--format", "constraints", "--with-suite")) == sorted(with_suite)
    assert export("--format", "pylock") == (run.out.parent / run.by_id()[OK]["lock"]).read_text()
    both = tomllib.loads(export("--format", "pylock", "--with-suite"))
    assert [p["name"] for p in both["packages"]] == sorted(with_suite)
    assert both["tool"]["envbuilder"]["lock-sha256"] == run.by_id()[OK]["lock_sha256"]
    assert (
        cli.main(["install", OK, "--lock", str(lockfile), "--allow-unverified", "--dry-run"]) == 0
    )

    # A suite group locked against another lock is refused, naming what to do.
    suite_path = run.out.parent / run.by_id()[OK]["suite_lock"]
    suite_path.write_text(suite_path.read_text().replace(run.by_id()[OK]["lock_sha256"], "0" * 64))
    capsys.readouterr()
    assert cli.main(["export", OK, "--lock", str(lockfile), "--with-suite"]) == 2
    assert "this suite group was locked against lock sha256 '0000" in capsys.readouterr().err


def test_a_run_that_asked_nothing_keeps_its_answers_for_the_next_while_they_hold(
    wheels: Wheels, tmp_path: Path, resolve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-run whose pages are all fresh decides nothing again: it takes the answers and
    locks of the last run that asked the index nothing (`envbuilder.resolve.memo`), byte
    for byte, into the same --out or a fresh one; an edited lock, stale pages or
    --upgrade decide again."""
    with _server(wheels, cache_control="max-age=600") as server:
        _keeps_answers(_matrix_for(tmp_path, server), tmp_path, resolve, monkeypatch)


def _keeps_answers(
    matrix: Path, tmp_path: Path, resolve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = resolve(matrix)
    locks = {p.name: p.read_bytes() for p in first.out.iterdir()}
    # the first run heard a 404 (the runtime is not on the per-CUDA index), which the cache
    # does not keep: it keeps no answers, and the next decides again, asking nothing
    second = resolve(matrix)
    assert "0 requests" in second.stderr and "(kept)" not in second.stderr
    third = resolve(matrix)
    assert "every page it read is still fresh and unchanged" in third.stderr, third.stderr
    assert third.stderr.count("(kept)") == len(EXPECTED_STATUS)
    assert third.doc == first.doc
    assert {p.name: p.read_bytes() for p in third.out.iterdir()} == locks

    fresh = resolve(matrix, out=tmp_path / "fresh")
    assert "(kept)" in fresh.stderr
    written = {p.name: p.read_bytes() for p in fresh.out.iterdir()}
    assert written.pop("resolution.json") != locks["resolution.json"]  # its paths name fresh/
    assert written == {k: v for k, v in locks.items() if k != "resolution.json"}
    assert fresh.by_id()[OK]["lock"] == f"fresh/{lock_filename(OK)}"
    assert (tmp_path / fresh.by_id()[OK]["lock"]).is_file()

    edited = first.out / lock_filename(OK)
    edited.write_text(edited.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    again = resolve(matrix)
    assert "(kept)" not in again.stderr
    assert "(kept)" not in resolve(matrix, "--upgrade").stderr
    later = time.time() + 86_400
    monkeypatch.setattr("time.time", lambda: later)
    assert "(kept)" not in resolve(matrix).stderr
