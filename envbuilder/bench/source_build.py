"""Benchmark of a source build: ``nox -s bench -- source-build [--in-place] [--builder-image IMG]``.

Builds a small C-extension sdist (made here, no CUDA) through the same code
path as ``envbuilder build-wheel``: in a container of the builder image with
network none (default; the image needs python3, venv and g++), or ``--in-place``
in a scratch venv. The C file is compiled under a name that differs per
build, as nvcc names a ``.cu`` file's host code, so that the rebuild shows
whether the normaliser takes that out. Prints the cold build's wall time, the cache hit's (median
of ``--repeat``) and whether a forced rebuild of the same key gave the same
wheel bytes. Exits 1 when the cache hit takes more than 1 s or the bytes differ.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel
from envbuilder.sourcebuild.builder import BuildPlan, build_wheel
from envbuilder.sourcebuild.cache import BuiltWheelCache

__all__ = ["NETWORK_PROBE", "NVCC_TEMPORARY_NAME", "c_extension_sdist", "locked", "main"]

HIT_TARGET_S = 1.0
BUILD_GROUP = ("setuptools==80.9.0", "wheel==0.45.1")

_SETUP = """\
from setuptools import Extension, setup
{probe}{source}
setup(
    name="{name}",
    version="1.0",
    ext_modules=[Extension("{module}", [source], extra_compile_args=flags)],
)
"""

#: setup.py code that compiles the C file through a copy named as nvcc names its temporary
#: files (``tmpxft_<pid>_<counter>-6_<name>.cudafe1.c``): a name that differs per build.
#: Without debug information, as torch's extension builder compiles a ``.cu`` file's host
#: code (xformers' ``_C.so`` has DWARF for its ``.cpp`` files only): in a debug string
#: section the linker lays merged strings out by their contents, which renaming cannot undo.
NVCC_TEMPORARY_NAME = """
import os, shutil
source = "tmpxft_%08x_00000000-6_{module}.cudafe1.c" % int.from_bytes(os.urandom(4), "big")
shutil.copyfile("{module}.c", source)
flags = ["-g0"]
"""

_C = """\
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }
"""

#: setup.py code that reaches for the network and fails the build saying what happened:
#: with network ``none`` there is no route at all ("Network is unreachable").
NETWORK_PROBE = """
import socket
try:
    socket.create_connection(("192.0.2.1", 80), timeout=5)
except OSError as e:
    raise SystemExit(f"network probe: {e}")
raise SystemExit("network probe: connected")
"""


def c_extension_sdist(
    directory: Path, name: str = "envb-demo", *, probe: str = "", nvcc_names: bool = False
) -> Path:
    """``<name>-1.0.tar.gz`` with a setup.py building one C extension; fixed mtimes.

    With ``nvcc_names``, the C file is compiled under a name that differs per build,
    as a ``.cu`` file's host code is (see `envbuilder.sourcebuild.elf`)."""
    module = name.replace("-", "_")
    top = f"{module}-1.0"
    source = NVCC_TEMPORARY_NAME if nvcc_names else f'\nsource = "{module}.c"\nflags = []\n'
    files = {
        "setup.py": _SETUP.format(
            name=name, module=module, probe=probe, source=source.format(module=module)
        ),
        f"{module}.c": _C % (module, module),
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
    }
    path = directory / f"{top}.tar.gz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{member}")
            info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def locked(path: Path, name: str, version: str) -> LockedWheel:
    """A file as a lock names it: by file URL, with its sha256 and size."""
    data = path.read_bytes()
    return LockedWheel(
        name=name,
        version=version,
        filename=path.name,
        url=path.as_uri(),
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuilder.bench source-build")
    parser.add_argument("--in-place", action="store_true", help="a scratch venv, not a container")
    parser.add_argument("--builder-image", default="envbuilder-test/builder:bookworm")
    parser.add_argument("--python", default=None, help="with --in-place: the interpreter")
    parser.add_argument("--wheels", type=Path, default=None, help="setuptools and wheel wheels")
    parser.add_argument("--repeat", type=int, default=5, help="cache hits timed (median)")
    args = parser.parse_args(list(argv))
    with tempfile.TemporaryDirectory(prefix="envbuilder-bench-source-") as tmp:
        root = Path(tmp)
        wheels = args.wheels or root / "wheels"
        if args.wheels is None:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary", ":all:", "-d", str(wheels), *BUILD_GROUP],
                check=True,
            )  # fmt: skip
        group = []
        for requirement in BUILD_GROUP:
            name, version = requirement.split("==")
            path = next(iter(sorted(wheels.glob(f"{name}-{version}-*.whl"))))
            group.append(locked(path, name, version))
        sdist = c_extension_sdist(root, nvcc_names=True)
        plan = BuildPlan(
            combination_id="bench-envb-demo",
            python=f"{sys.version_info.major}.{sys.version_info.minor}",
            sdist=locked(sdist, "envb-demo", "1.0"),
            build_group=tuple(group),
            cuda=False,
        )
        client = None
        if not args.in_place:
            from envbuilder.docker.build import docker_client

            client = docker_client()
        cache = BuiltWheelCache(root / "built")
        files = WheelCache(root / "files")

        def build(force: bool = False) -> tuple[float, str, bool]:
            outcome = build_wheel(
                plan, mode="in-place" if args.in_place else "docker", cache=cache, files=files,
                builder_image=None if args.in_place else args.builder_image, client=client,
                python=args.python, log_path=root / "build.log", force=force,
            )  # fmt: skip
            return outcome.seconds, outcome.built.sha256, outcome.hit

        cold, first_sha, _ = build()
        hits = [build() for _ in range(args.repeat)]
        hit = statistics.median(s for s, _, _ in hits)
        again, second_sha, _ = build(force=True)
    where = "in place" if args.in_place else f"in {args.builder_image} (network none)"
    print(f"source build {where}: C-extension sdist, compiled under nvcc-like temporary names")
    print(f"  cold build            {cold:8.2f} s")
    print(f"  rebuild, same key     {again:8.2f} s")
    print(f"  cache hit (median/{args.repeat})  {hit:8.3f} s   target <= {HIT_TARGET_S:.1f} s")
    same = first_sha == second_sha and all(sha == first_sha for _, sha, _ in hits)
    print(f"  wheel sha256          {first_sha} ({'same' if same else 'DIFFERS'} on rebuild)")
    ok = hit <= HIT_TARGET_S and same and all(h for _, _, h in hits)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
