"""Small sdists with a C extension, made by the tests, for the source builder."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from envbuilder.docker.plan import LockedWheel

__all__ = ["NETWORK_PROBE", "c_extension_sdist", "locked"]

_SETUP = """\
from setuptools import Extension, setup
{probe}
setup(
    name="{name}",
    version="1.0",
    ext_modules=[Extension("{module}", ["{module}.c"])],
)
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


def c_extension_sdist(directory: Path, name: str = "envb-demo", *, probe: str = "") -> Path:
    """``<name>-1.0.tar.gz`` with a setup.py building one C extension; fixed mtimes."""
    module = name.replace("-", "_")
    top = f"{module}-1.0"
    files = {
        "setup.py": _SETUP.format(name=name, module=module, probe=probe),
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
