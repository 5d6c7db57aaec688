"""Run a source build: from the locked files only, into the cache of built wheels.

``build_wheel`` computes the build key first; a cached build of that key is
the answer (a cache hit reads one record and hashes one wheel). Otherwise
it fetches the sdist and the locked wheels into the host's wheel cache
(each checked against its sha256), then builds:

- in a container of the builder image with network ``none`` (``docker``),
  the files mounted read-only, in a fresh venv at a fixed path (``/build``);
- or in a scratch venv on the host (``in-place``), for a GPU machine with no
  Docker: pip is told ``--no-index`` and every proxy points nowhere; the
  host's torch is used (its identity is part of the key) and, with
  ``toolchain="host"``, the host's nvcc instead of the compiler wheels.

Either way ``recipe/build.py`` installs the hash-pinned build group with
``--no-index --require-hashes`` and runs ``pip wheel --no-build-isolation``
with the fixed flags, ``SOURCE_DATE_EPOCH`` and ``MAX_JOBS``; the wheel is then
made reproducible (`reproducible.normalise_wheel`) and stored with its build
record: the key and its inputs, the wheel's sha256 and ``xformers/cpp_lib.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from envbuilder.conformance._wheel import record_libraries
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel, install_requirements
from envbuilder.errors import EnvbuilderError, InputError
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, BuiltWheel, BuiltWheelCache
from envbuilder.sourcebuild.key import BuildKey
from envbuilder.sourcebuild.reproducible import normalise_wheel

__all__ = [
    "RECIPE",
    "SOURCE_DATE_EPOCH",
    "BuildFailed",
    "BuildOutcome",
    "BuildPlan",
    "Mode",
    "Toolchain",
    "build_wheel",
    "path_map",
    "recipe_digest",
]

RECIPE = Path(__file__).with_name("recipe") / "build.py"
SOURCE_DATE_EPOCH = 315532800  # 1980-01-01, the earliest date a zip entry can carry
BUILD_RECORD_MEMBER = "xformers/cpp_lib.json"
CONTAINER_WORK = "/build"  # where a container builds; an in-place build's path is mapped to it

Mode = Literal["docker", "in-place"]
Toolchain = Literal["wheels", "host"]


class BuildFailed(EnvbuilderError):
    """The source build failed; the message has the end of its log."""


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    """What one source build reads, all of it locked."""

    combination_id: str
    python: str  # the target's, "3.12"
    sdist: LockedWheel  # an sdist, despite the name: what to fetch and its sha256
    build_group: tuple[LockedWheel, ...]
    runtime: tuple[LockedWheel, ...] = ()  # the combination's lock (torch), for a container
    torch_sha256: str | None = None  # None: the sdist builds without torch
    arch_list: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # "NAME=value"
    cuda: bool = True  # whether the build compiles CUDA (needs a toolchain)

    def group_for(self, toolchain: Toolchain) -> tuple[LockedWheel, ...]:
        """The build group; with the host's toolchain, without the compiler wheels."""
        if toolchain == "host":
            return tuple(w for w in self.build_group if not w.name.startswith("nvidia-"))
        return self.build_group


@dataclass(frozen=True, kw_only=True)
class BuildOutcome:
    built: BuiltWheel
    key: BuildKey
    hit: bool
    seconds: float
    log: Path | None = None


@dataclass(kw_only=True)
class _Run:
    plan: BuildPlan
    mode: Mode
    toolchain: Toolchain
    jobs: int
    log: IO[str]
    python: str = sys.executable
    builder_image: str | None = None
    client: Any = None
    env: dict[str, str] = field(default_factory=dict)


def recipe_digest() -> str:
    """sha256 of what turns the inputs into a wheel: the in-builder script and the normalisers."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in (RECIPE, here / "reproducible.py", here / "elf.py"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_wheel(
    plan: BuildPlan,
    *,
    mode: Mode,
    cache: BuiltWheelCache,
    files: WheelCache,
    toolchain: Toolchain = "wheels",
    builder_image: str | None = None,
    client: Any = None,
    python: str | None = None,
    jobs: int | None = None,
    log_path: Path | None = None,
    force: bool = False,
) -> BuildOutcome:
    """The wheel of ``plan``: from the cache when built before with the same key, else built."""
    started = time.monotonic()
    if mode == "docker" and toolchain == "host":
        raise InputError("--toolchain host is for --in-place builds: a container has no host nvcc")
    if mode == "docker" and (builder_image is None or client is None):
        raise InputError("a container build needs a builder image and a Docker client")
    run = _Run(
        plan=plan,
        mode=mode,
        toolchain=toolchain,
        jobs=jobs or os.cpu_count() or 1,
        log=(log_path or Path(os.devnull)).open("w", encoding="utf-8"),
        python=python or sys.executable,
        builder_image=builder_image,
        client=client,
    )
    try:
        key = _key(run)
        cached = None if force else cache.get(key.digest)
        if cached is not None:
            return BuildOutcome(
                built=cached, key=key, hit=True, seconds=time.monotonic() - started, log=log_path
            )
        built = _build(run, key, cache, files, started)
    finally:
        run.log.close()
    return BuildOutcome(
        built=built, key=key, hit=False, seconds=time.monotonic() - started, log=log_path
    )


def _environment(run: _Run) -> dict[str, str]:
    """The fixed build environment: the plan's flags, the epoch, the jobs; nothing of the caller's."""
    env = dict(f.split("=", 1) for f in run.plan.flags)
    env.update(
        {
            "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
            "MAX_JOBS": str(run.jobs),
            "PYTHONHASHSEED": "0",
            "PIP_NO_INDEX": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_CONFIG_FILE": "/dev/null",  # no find-links or index of the host's pip.conf
            "LANG": "C.UTF-8",
            "TZ": "UTC",
        }
    )
    return env


def _key(run: _Run) -> BuildKey:
    plan = run.plan
    toolchain = [f"{w.name}=={w.version} sha256={w.sha256}" for w in plan.group_for(run.toolchain)]
    if run.mode == "docker":
        image = run.client.images.get(run.builder_image)
        builder = f"image:{image.id}"
        torch = plan.torch_sha256 or "none"
    else:
        builder = "host:" + _host_identity(run.python)
        torch = _host_torch(run.python) if plan.torch_sha256 is not None else "none"
        if run.toolchain == "host" and plan.cuda:
            toolchain.append("host-nvcc:" + _host_nvcc())
    return BuildKey.of(
        sdist_sha256=plan.sdist.sha256,
        torch=torch,
        toolchain=toolchain,
        arch_list=plan.arch_list,
        flags=plan.flags,
        builder=builder,
        recipe=recipe_digest(),
    )


def _probe(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except OSError as e:
        raise InputError(f"cannot run {argv[0]!r}: {e.strerror}") from e
    if done.returncode != 0:
        raise InputError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout


def _host_identity(python: str) -> str:
    """The interpreter's version and platform and the C++ compiler's version, hashed."""
    version = _probe(
        [python, "-c", "import sys, sysconfig; print(sys.version, sysconfig.get_platform())"]
    )
    compiler = os.environ.get("CXX") or shutil.which("c++") or "c++"
    cxx = _probe([compiler, "--version"]).splitlines()[0]
    text = f"{version.strip()} | {cxx} | {platform.machine()}"
    return hashlib.sha256(text.encode()).hexdigest()


_TORCH_IDENTITY = """
import hashlib, importlib.metadata as m, sys
dist = m.distribution("torch")
record = dist.read_text("RECORD") or ""
print(dist.version, hashlib.sha256(record.encode()).hexdigest())
"""


def _host_torch(python: str) -> str:
    """The host's torch: its version and the sha256 of its RECORD (every installed file's hash)."""
    out = _probe([python, "-c", _TORCH_IDENTITY]).split()
    return f"host:torch=={out[0]} record-sha256={out[1]}"


def _host_nvcc() -> str:
    nvcc = shutil.which("nvcc") or (
        str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc") if os.environ.get("CUDA_HOME") else None
    )
    if nvcc is None:
        raise InputError("--toolchain host: no nvcc on PATH nor in CUDA_HOME")
    return hashlib.sha256(_probe([nvcc, "--version"]).encode()).hexdigest()


def _build(
    run: _Run, key: BuildKey, cache: BuiltWheelCache, files: WheelCache, started: float
) -> BuiltWheel:
    plan = run.plan
    group = plan.group_for(run.toolchain)
    runtime = plan.runtime if run.mode == "docker" else ()
    with tempfile.TemporaryDirectory(prefix="envbuilder-source-") as tmp:
        root = Path(tmp)
        inputs = root / "in"
        out = root / "out"
        inputs.mkdir()
        out.mkdir()
        for wheel in (plan.sdist, *group, *runtime):
            files.link_into(wheel, inputs)
        requirements: list[str] = []
        for name, wheels in (("runtime.txt", runtime), ("build.txt", group)):
            if wheels:
                (inputs / name).write_text(install_requirements(wheels), encoding="utf-8")
                requirements.append(name)
        env = _environment(run)
        if run.mode == "docker":
            _in_container(run, root, requirements, {**env, **path_map(CONTAINER_WORK)})
        else:
            work = _in_place_work()
            try:
                _in_place(run, root, requirements, {**env, **path_map(str(work))}, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        made = sorted(out.glob("*.whl"))
        if len(made) != 1:
            raise BuildFailed(f"the build made {len(made)} wheels, expected one")
        data = normalise_wheel(made[0].read_bytes(), source_date_epoch=SOURCE_DATE_EPOCH)
        made[0].write_bytes(data)
        record = _record(run, key, made[0], data, time.monotonic() - started)
        return cache.put(key.digest, made[0], record)


def _command(requirements: Sequence[str], *, files: str, work: str, out: str, sdist: str,
             toolchain: Toolchain, recipe: str) -> list[str]:  # fmt: skip
    argv = [recipe, "--files", files, "--sdist", sdist, "--out", out, "--work", work]
    for name in requirements:
        argv += ["--requirements", f"{files}/{name}"]
    return [*argv, "--toolchain", toolchain]


def _in_container(
    run: _Run, root: Path, requirements: Sequence[str], env: Mapping[str, str]
) -> None:
    from envbuilder.docker.build import run_container

    script = _command(
        requirements, files="/in", work=CONTAINER_WORK, out="/out", sdist=run.plan.sdist.filename,
        toolchain=run.toolchain, recipe="/recipe/build.py",
    )  # fmt: skip
    shell = "python3 -m venv /opt/build && exec /opt/build/bin/python " + " ".join(script)
    command = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), "sh", "-c", shell]
    volumes = {
        str(root / "in"): {"bind": "/in", "mode": "ro"},
        str(RECIPE.parent): {"bind": "/recipe", "mode": "ro"},
        str(root / "out"): {"bind": "/out", "mode": "rw"},
    }
    status, output = run_container(
        run.client, str(run.builder_image), command, log=run.log, volumes=volumes
    )
    if status != 0:
        raise BuildFailed(
            f"the build in {run.builder_image} failed (exit {status}):\n{output[-3000:]}"
        )


def path_map(work: str) -> dict[str, str]:
    """Compiler flags that write ``work`` as ``/build`` into what they make (``__FILE__``, debug info).

    ``CPPFLAGS``, not ``CFLAGS``: setuptools appends ``CPPFLAGS`` to the interpreter's
    compile flags, while ``CFLAGS`` replaces them (their ``-O2``, ``-DNDEBUG``).
    nvcc reads ``NVCC_APPEND_FLAGS`` and hands ``-Xcompiler`` options to the host
    compiler, which preprocesses and compiles every ``.cu`` file's host side.
    A path nvcc or the shell would split (a comma, a space) is not mapped."""
    if work == CONTAINER_WORK or any(c in work for c in ", \t\n'\""):
        return {}
    option = f"-ffile-prefix-map={work}={CONTAINER_WORK}"
    return {"CPPFLAGS": option, "NVCC_APPEND_FLAGS": f"-Xcompiler={option}"}


def _in_place_work() -> Path:
    """A fresh directory of this build's own (``mkdtemp``: a new name, mode 0700, never an
    existing path): two builds of one key cannot meet, and nothing planted in the temporary
    directory (a symbolic link) can lead a build elsewhere. Its name is as long every time,
    and the path map writes it as ``/build`` into what the compilers make."""
    return Path(tempfile.mkdtemp(prefix="envbuilder-build-"))


def _in_place(
    run: _Run, root: Path, requirements: Sequence[str], env: Mapping[str, str], work: Path
) -> None:
    """Build in *work* (fresh and private, `_in_place_work`); the caller removes it."""
    venv = work / "venv"
    argv = [run.python, "-m", "venv", str(venv)]
    _logged(run, argv, os.environ)
    if run.plan.torch_sha256 is not None:
        _see_host_packages(run.python, venv)  # the host's torch, whose identity is in the key
    nowhere = "http://127.0.0.1:9"  # nothing listens on the discard port: any download fails
    base = {k: os.environ[k] for k in ("PATH", "HOME", "CUDA_HOME", "CXX", "CC") if k in os.environ}
    full = {**base, **env, "http_proxy": nowhere, "https_proxy": nowhere,
            "HTTP_PROXY": nowhere, "HTTPS_PROXY": nowhere, "no_proxy": "", "NO_PROXY": ""}  # fmt: skip
    script = _command(
        requirements, files=str(root / "in"), work=str(work), out=str(root / "out"),
        sdist=run.plan.sdist.filename, toolchain=run.toolchain, recipe=str(RECIPE),
    )  # fmt: skip
    _logged(run, [str(venv / "bin" / "python"), *script], full)


def _see_host_packages(python: str, venv: Path) -> None:
    """Let the scratch venv import what *python* imports (its torch), after its own packages.

    ``--system-site-packages`` is not enough: it gives the *base* interpreter's packages, and
    a host's torch often lives in a venv of its own (``python3`` is ``/opt/…/.venv/bin/python3``
    on the GPU machines here), which the scratch venv would then not see."""
    found = subprocess.run(
        [
            python,
            "-c",
            "import json, sys; print(json.dumps([p for p in sys.path if p.endswith('-packages')]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    paths = json.loads(found.stdout)
    (site_packages,) = (venv / "lib").glob("python*/site-packages")
    (site_packages / "_envbuilder_host.pth").write_text("".join(f"{p}\n" for p in paths))


def _logged(run: _Run, argv: Sequence[str], env: Mapping[str, str]) -> None:
    run.log.write("+ " + " ".join(argv) + "\n")
    run.log.flush()
    done = subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, check=False)
    run.log.write(done.stdout + done.stderr)
    run.log.flush()
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise BuildFailed(f"{' '.join(argv[:2])} … failed (exit {done.returncode}):\n{tail}")


def _record(run: _Run, key: BuildKey, wheel: Path, data: bytes, seconds: float) -> dict[str, Any]:
    cpp_lib: Any = None
    libraries: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        if records:
            libraries = record_libraries(archive.read(records[0]).decode("utf-8", "replace"))
        if BUILD_RECORD_MEMBER in archive.namelist():
            try:
                cpp_lib = json.loads(archive.read(BUILD_RECORD_MEMBER))
            except ValueError:
                cpp_lib = None
    return {
        "schema": RECORD_SCHEMA,
        "combination": run.plan.combination_id,
        "key": key.digest,
        "key_inputs": key.inputs(),
        "mode": run.mode,
        "toolchain": run.toolchain,
        "jobs": run.jobs,
        "seconds": round(seconds, 1),
        "wheel": {
            "filename": wheel.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "libraries": libraries,
        },
        "cpp_lib": cpp_lib,
    }
