"""What a build takes from its base image beyond the base's own layers: its Python,
checked before any wheel is fetched, and the ``compiler`` layer.

``compiler`` lies right above the base: Debian's gcc, g++ and libc headers, installed by
``install-compiler.sh`` with the base's own apt (triton compiles its launcher
and inductor its CPU kernels with them; OpenMP's ``omp.h`` rules out a
compiler from wheels such as ``ziglang``). It is the one step with network,
made once per base image in a process (beside the first wheel install: apt
waits on the network while pip works) and shared by every combination of that
base, ``no_cache`` builds included; its packages and compiler version are
recorded in the image.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from envbuilder.docker.client import DockerClient
from envbuilder.docker.containers import build_error, run_container
from envbuilder.docker.daemon import BuildFailed
from envbuilder.docker.layers import BaseImage
from envbuilder.docker.manifest import COMPILER_RECORD_DIR, DOCKER_DIR
from envbuilder.errors import InputError
from envbuilder.reporter import Reporter

__all__ = ["COMPILER_PACKAGES", "check_python"]

#: Debian packages of the ``compiler`` layer: ``gcc`` for triton's launcher (``cc``), ``g++``
#: for inductor's CPU kernels (with OpenMP from libgcc), the C library's headers for both.
COMPILER_PACKAGES: tuple[str, ...] = ("gcc", "g++", "libc6-dev")
#: The network of the container that installs the compiler: the host's, so that apt reaches
#: the mirror the base names even where the bridge network has no name resolution.
_COMPILER_NETWORK = "host"


def check_python(client: DockerClient, base: BaseImage, python: str, *, log: IO[str]) -> None:
    """Refuse a base image whose ``python3`` is not ``python``, before any wheel is fetched."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    status, output = run_container(client, base.id, ["python3", "-c", code], log=log)
    found = output.strip().splitlines()[-1] if output.strip() else ""
    if status != 0:
        raise BuildFailed(
            f"the base image {base.ref!r} cannot run python3 ({output.strip()[-300:] or f'exit {status}'}); "
            f"choose a base with Python {python} (--base-image or base-image in matrix.toml)"
        )
    if found != python:
        raise InputError(
            f"the base image {base.ref!r} has Python {found}, the lock is for Python {python}; "
            "choose a base with that Python (--base-image or base-image in matrix.toml)"
        )


def _install_compiler(
    client: DockerClient, base: BaseImage, out: Path, *, log: IO[str], reporter: Reporter
) -> None:
    """``out/compiler``: the files apt installs for ``COMPILER_PACKAGES`` in a container of
    the base (the build's one step with network: the base's own Debian mirror)."""
    # Only its own tree is mounted: the wheels' container installs beside it, and the
    # hand-over to the user (chown) must not walk trees another container still writes.
    (out / "compiler").mkdir(exist_ok=True)
    with reporter.step(f"install {', '.join(COMPILER_PACKAGES)} from the base's Debian packages"):
        status, output = run_container(
            client,
            base.id,
            ["sh", "/envbuilder/recipe/install-compiler.sh", "/envbuilder/out/compiler", *COMPILER_PACKAGES],
            volumes={
                str(DOCKER_DIR): {"bind": "/envbuilder/recipe", "mode": "ro"},
                str(out / "compiler"): {"bind": "/envbuilder/out/compiler", "mode": "rw"},
            },
            log=log,
            reporter=reporter,
            network=_COMPILER_NETWORK,
            role="compiler",
        )  # fmt: skip
    if status != 0:
        raise BuildFailed(
            f"installing the compiler ({' '.join(COMPILER_PACKAGES)}) into the base image "
            f"{base.ref!r} failed (it needs a Debian-based base whose apt reaches its mirror):\n"
            f"  {build_error(output)}"
        )


def _compiler_facts(stage: Path) -> dict[str, str]:
    """``cc``, ``cxx`` (their ``--version`` first lines) and ``packages`` from ``compiler.txt``."""
    record = stage / COMPILER_RECORD_DIR.lstrip("/") / "compiler.txt"
    facts: dict[str, str] = {}
    packages: list[str] = []
    for line in record.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(": ")
        if key in ("cc", "cxx"):
            facts[key] = value.strip()
        elif key == "package":
            packages.append(value.strip())
    facts["packages"] = " ".join(packages)
    return facts
