"""What an environment has, run inside it: ``python _envprobe.py`` prints one JSON object.

``envbuilder doctor --python PATH`` runs this file, by path, in an interpreter
that need not have envbuilder (or packaging) installed, so it imports only the
standard library and runs on every Python the matrix covers (3.10 and later).
It reports the interpreter, the values PEP 508 markers are evaluated against
(the names ``packaging.markers.default_environment`` gives), and every
distribution with its version and where its ``RECORD`` lies; the doctor reads
those files itself.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

SCHEMA = "envbuilder.env-probe/1"


def _full_version(info: Any) -> str:
    version = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        version += info.releaselevel[0] + str(info.serial)
    return version


def marker_environment() -> dict[str, str]:
    """The PEP 508 marker variables of this interpreter."""
    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": _full_version(sys.implementation.version),
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def _record(dist: metadata.Distribution) -> str | None:
    for file in dist.files or ():
        if file.name == "RECORD" and file.parent.name.endswith(".dist-info"):
            return str(file.locate())
    return None


def report() -> dict[str, Any]:
    dists = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            dists.append({"name": name, "version": dist.version, "record": _record(dist)})
    return {
        "schema": SCHEMA,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "executable": sys.executable,
        "prefix": sys.prefix,
        "markers": marker_environment(),
        "distributions": dists,
    }


if __name__ == "__main__":
    print(json.dumps(report()))
    sys.stdout.flush()
