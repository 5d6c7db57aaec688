"""The full dependency closure of a decided combination, computed by uv.

envbuilder decides torch and xformers itself (from the evidence in the
wheels); the generic part — every other dependency, for a target that is
not the host — is uv's job. The result is written as a PEP 751
``pylock.<id>.toml`` and a ``requirements.<id>.txt`` for
``pip install --require-hashes``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from packaging.pylock import PackageWheel, Pylock
from packaging.version import Version

from envbuilder.credentials import Credentials, redact_text
from envbuilder.errors import EnvbuilderError
from envbuilder.extras import missing
from envbuilder.index import http as index_http
from envbuilder.index.relay import UV_DOWNLOADS as RELAYED_UV_DOWNLOADS
from envbuilder.index.relay import UvRelay
from envbuilder.index.simple import wheel_platforms
from envbuilder.pylock import (
    LockedArchive,
    LockedPackage,
    PylockError,
    assembled,
    read_lock,
    requirements_text,
    select,
)
from envbuilder.target import Target

__all__ = [
    "GENERATED_BY",
    "ClosureError",
    "IndexArgument",
    "PinnedFile",
    "assembled_lock",
    "compile_closure",
    "find_uv",
    "lock_inputs",
    "lock_requirements",
    "remember_interpreter",
    "select_for_target",
]

logger = logging.getLogger(__name__)

GENERATED_BY = "nox -s resolve (envbuilder resolve)"


class ClosureError(EnvbuilderError):
    """uv could not compute the closure; the message carries uv's own explanation."""


@dataclass(frozen=True, kw_only=True)
class IndexArgument:
    """An index handed to uv: ``default`` (lowest priority), ``index`` or ``find-links``."""

    role: Literal["default", "index", "find-links"]
    url: str

    def argv(self) -> list[str]:
        flag = {"default": "--default-index", "index": "--index", "find-links": "--find-links"}
        return [flag[self.role], self.url]


def find_uv() -> str:
    """The uv executable: the one installed beside envbuilder, else on PATH."""
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return str(beside)
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError) as e:
        raise missing("uv", extra="resolve", needed_for="computing dependency closures") from e


def _uv_dies_with_us() -> Any:
    """A ``preexec_fn`` that has Linux send uv SIGTERM when the thread that started it
    dies (SIGTERM, SIGKILL, ``os._exit`` after Ctrl-C): uv never outlives envbuilder.
    None where there is no ``prctl``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    set_pdeathsig, sigterm = 1, int(signal.SIGTERM)  # PR_SET_PDEATHSIG

    def arm() -> None:
        prctl(set_pdeathsig, sigterm)
        if os.getppid() != parent:  # envbuilder died before the line above
            os._exit(1)

    return arm


def _text_pipe(text: str) -> int:
    """A pipe's read end that yields ``text``: uv reads it as ``/dev/fd/N`` (its netrc,
    its constraints), so that a password is never in a file and nothing is left behind
    however envbuilder ends."""
    read_fd, write_fd = os.pipe()
    data = text.encode("utf-8")

    def feed() -> None:
        try:
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
        except OSError:  # uv ended without reading it all
            pass

    threading.Thread(target=feed, name="uv-pipe", daemon=True).start()
    return read_fd


def _run_uv(
    argv: list[str], env: Mapping[str, str], pass_fds: tuple[int, ...], stdin: str
) -> tuple[int, str, str]:
    """uv's exit status, stdout and stderr, ``stdin`` fed to it; uv is stopped when
    envbuilder is (an exception here, Ctrl-C, or envbuilder's death)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        env=dict(env),
        pass_fds=pass_fds,
        preexec_fn=_uv_dies_with_us(),
    )
    for fd in pass_fds:
        os.close(fd)  # uv holds its own copy
    try:
        stdout, stderr = proc.communicate(stdin)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc.returncode, stdout, stderr


def remember_interpreter(*, uv: str, python: str, cache_dir: Path) -> None:
    """Have uv record ``python`` in its cache (``uv python find``) before the closures.

    Every ``uv pip compile --python`` runs the interpreter to ask what it is unless
    its cache already knows; the closures of a run start together on a cold cache,
    so each asked (a Python start-up apiece). Asked once before the first of them,
    they all find the answer. A failure only costs that saving."""
    env = dict(os.environ)
    env.update(
        {"UV_PYTHON_DOWNLOADS": "never", "UV_CACHE_DIR": str(cache_dir), "UV_NO_CONFIG": "1"}
    )
    try:
        returncode, _, stderr = _run_uv([uv, "python", "find", python], env, (), "")
    except OSError as e:
        logger.debug("uv python find %s: %s", python, e)
        return
    if returncode != 0:
        logger.debug("uv python find %s: %s", python, stderr.strip())


def lock_inputs(
    requirements: Sequence[str],
    target: Target,
    indexes: Sequence[IndexArgument],
    pinned: Sequence[PinnedFile] = (),
) -> dict[str, Any]:
    """What a lock was computed from; a lock is reused only when this is unchanged."""
    return {
        "generated-by": GENERATED_BY,
        "pinned": [f"{p.filename} sha256={p.sha256}" for p in pinned],
        "requirements": list(requirements),
        "python": target.python,
        "platform": target.platform,
        "indexes": [f"{i.role} {i.url}" for i in indexes],
    }


def compile_closure(
    *,
    requirements: Sequence[str],
    python_floor: str,
    indexes: Sequence[IndexArgument],
    cache_dir: Path,
    constraints: Sequence[str] = (),
    uv: str,
    python: str | None = None,
    downloads: int | None = None,
    offline: bool = False,
    ca_bundle: str | None = None,
    environ: Mapping[str, str] | None = None,
    credentials: Credentials | None = None,
    relay: UvRelay | None = None,
) -> Pylock:
    """Run ``uv pip compile --universal`` from ``python_floor`` up; return its PEP 751 document.

    One universal resolution serves every target that shares the same
    requirements (the Python versions of one torch/xformers pair): each
    target then takes its own packages with `select_for_target`.
    ``constraints`` hold the pinned releases (``torch==2.0.1``) so that a
    dependency requiring a pinned project back (triton 2.0.0 requires
    torch) gets the pinned release, and one requiring another release is
    uv's error naming it.
    ``credentials`` reach uv through a private netrc file, never its command line.
    ``python`` is the interpreter uv would build an sdist with; naming one spares
    each run uv's search of the PATH for an interpreter of the target's version
    (seconds where the PATH holds version-manager shims). The target comes from
    ``python_floor`` either way. ``downloads`` caps uv's concurrent downloads (so its
    connections per host) unless the environment sets ``UV_CONCURRENT_DOWNLOADS``; through
    a relay, at least the relay's `UV_DOWNLOADS`.
    uv's requests get envbuilder's read timeout and as many retries as fit in its
    time budget per URL (``UV_HTTP_TIMEOUT``, ``UV_HTTP_RETRIES``, unless the
    environment sets them): a hung page costs uv what it costs envbuilder.
    With a ``relay``, uv reads the http(s) indexes' pages and core metadata through it
    (fetched once per run, shared by every uv process); its answer names the
    indexes' own URLs.
    """
    if not requirements:
        return read_lock('lock-version = "1.0"\ncreated-by = "uv"\npackages = []\n', source="uv")
    if relay is not None and not offline and downloads is not None:
        # uv's requests reach the relay on loopback; the relay bounds what reaches the index
        downloads = max(downloads, RELAYED_UV_DOWNLOADS)
    env = _uv_environment(
        os.environ if environ is None else environ,
        cache_dir=cache_dir,
        downloads=downloads,
        ca_bundle=ca_bundle,
    )
    argv = _uv_argv(
        uv, python_floor=python_floor, python=python, indexes=indexes, relay=relay, offline=offline
    )
    # Nothing goes through a file: the netrc and the constraints are pipes, so that
    # nothing is left behind however envbuilder ends (Ctrl-C, SIGTERM, SIGKILL).
    pipes = _piped_texts(constraints, credentials, netrc=env.get("NETRC"))
    fds = {name: _text_pipe(text) for name, text in pipes.items()}
    if "constraints" in fds:
        argv += ["--constraints", f"/dev/fd/{fds['constraints']}"]
    if "netrc" in fds:
        env["NETRC"] = f"/dev/fd/{fds['netrc']}"
    logger.debug("running %s", argv)
    stdin = "".join(f"{r}\n" for r in requirements)
    returncode, stdout, stderr = _run_uv(argv, env, tuple(fds.values()), stdin)
    if relay is not None:
        stdout, stderr = relay.restore(stdout), relay.restore(stderr)
    if returncode != 0:
        message = redact_text((stderr or stdout).strip())
        raise ClosureError(f"uv could not resolve {', '.join(requirements)}: {message}")
    try:
        return read_lock(stdout, source="uv's closure")
    except PylockError as e:
        raise ClosureError(str(e)) from e


def _piped_texts(
    constraints: Sequence[str], credentials: Credentials | None, *, netrc: str | None
) -> dict[str, str]:
    """What uv reads from pipes, by name: its ``constraints`` and its netrc (the
    ``credentials``, then the entries of the user's own ``netrc``); none, no pipe."""
    pipes: dict[str, str] = {}
    if constraints:
        pipes["constraints"] = "".join(f"{c}\n" for c in constraints)
    if credentials:
        # The user's own netrc still counts: its entries follow ours.
        own = Path(netrc or Path.home() / ".netrc")
        kept = own.read_text(encoding="utf-8", errors="replace") if own.is_file() else ""
        pipes["netrc"] = credentials.netrc_text() + kept
    return pipes


def _uv_environment(
    environ: Mapping[str, str],
    *,
    cache_dir: Path,
    downloads: int | None,
    ca_bundle: str | None,
) -> dict[str, str]:
    """uv's environment: ``environ`` without its own index settings, with no interpreter
    downloads, no configuration files, ``cache_dir`` and envbuilder's HTTP limits (where
    ``environ`` sets none)."""
    env = dict(environ)
    env.update(
        {
            "UV_PYTHON_DOWNLOADS": "never",  # else uv hunts for an interpreter of the target version
            "UV_CACHE_DIR": str(cache_dir),
            "UV_NO_CONFIG": "1",
            "NO_COLOR": "1",
        }
    )
    for key in (
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "UV_INDEX",
        "UV_DEFAULT_INDEX",
        "UV_FIND_LINKS",
    ):
        env.pop(key, None)
    if downloads is not None:
        env.setdefault("UV_CONCURRENT_DOWNLOADS", str(downloads))
    timeout = max(1, round(index_http.DEFAULT_TIMEOUT))
    env.setdefault("UV_HTTP_TIMEOUT", str(timeout))
    env.setdefault(
        "UV_HTTP_RETRIES", str(max(0, int(index_http.DEFAULT_URL_BUDGET // timeout) - 1))
    )
    if ca_bundle:
        env["SSL_CERT_FILE"] = ca_bundle
    return env


def _uv_argv(
    uv: str,
    *,
    python_floor: str,
    python: str | None,
    indexes: Sequence[IndexArgument],
    relay: UvRelay | None,
    offline: bool,
) -> list[str]:
    """``uv pip compile``'s command line, the indexes' http(s) pages read through ``relay``
    when there is one and the run is online."""
    argv = [
        uv, "pip", "compile", "-",  # the requirements come on stdin, the lock on stdout
        "--universal",
        "--python-version", python_floor,
        "--generate-hashes",
        "--format", "pylock.toml",
        "--no-header",
        "--quiet",
    ]  # fmt: skip
    if python is not None:
        argv += ["--python", python]
    relayed = relay is not None and not offline
    for index in indexes:
        if relayed and index.role != "find-links" and index.url.startswith(("http:", "https:")):
            assert relay is not None
            index = IndexArgument(role=index.role, url=relay.index_url(index.url))
        argv += index.argv()
    if offline:
        argv.append("--offline")
    return argv


def select_for_target(closure: Pylock, target: Target) -> tuple[LockedPackage, ...]:
    """The target's part of a universal lock: each package whose marker holds, with the
    one archive that fits the target's tags."""
    try:
        return select(_for_platforms(closure, target), target, source="uv's closure")
    except PylockError as e:
        raise ClosureError(f"no closure for {target.describe()}: {e}") from e


def _for_platforms(closure: Pylock, target: Target) -> Pylock:
    """``closure`` without the wheels built for none of the target's platforms.

    A universal closure lists every platform's wheels (twenty for one release of
    cuda-bindings), and selecting reads the tags of each for every target; a wheel
    whose platform tags the target lacks can never be chosen. A package left with
    no wheel keeps them all, so that selection's own error names it.
    """
    platforms = frozenset(tag.platform for tag in target.tags)
    kept_packages = []
    for package in closure.packages:
        wheels = package.wheels or []
        kept = [w for w in wheels if not platforms.isdisjoint(_wheel_platforms(w))]
        if kept and len(kept) < len(wheels):
            package = dataclasses.replace(package, wheels=kept)
        kept_packages.append(package)
    return dataclasses.replace(closure, packages=kept_packages)


def _wheel_platforms(wheel: PackageWheel) -> list[str]:
    """The platform tags in a wheel's filename (``manylinux_2_28_x86_64``, ``any``)."""
    return wheel_platforms(
        wheel.name or unquote((wheel.url or wheel.path or "").rsplit("/", 1)[-1])
    )


@dataclass(frozen=True, kw_only=True)
class PinnedFile:
    """A file envbuilder chose itself (torch, xformers) and adds to uv's closure."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None


def assembled_lock(
    selected: Sequence[LockedPackage],
    *,
    pinned: Sequence[PinnedFile],
    inputs: Mapping[str, Any],
    target: Target,
    group: Literal["suite"] | None = None,
) -> tuple[str, Pylock]:
    """The PEP 751 text of uv's closure plus the pinned files, sorted, with envbuilder's
    header, and the lock it validated (what `read_lock` of the text gives).

    ``group="suite"``: the conformance suite's own dependencies beyond the lock, as
    the header says.

    A dependency may require a pinned project back (triton 2.0.0 requires
    torch): uv's entry for the pinned release gives way to the pinned file;
    any other release of it is an error.
    """
    pinned_names = {pin.name for pin in pinned}
    packages = [p for p in selected if p.name not in pinned_names]
    for pin in pinned:
        for other in (p for p in selected if p.name == pin.name):
            if other.version is None or Version(other.version) != Version(pin.version):
                raise ClosureError(
                    f"the dependencies of the chosen wheels need {pin.name} {other.version}, "
                    f"but envbuilder pins {pin.filename} ({pin.name} {pin.version})"
                )
        wheel = LockedArchive(
            kind="wheel", name=pin.filename, url=pin.url, sha256=pin.sha256, size=pin.size
        )
        packages.append(LockedPackage(name=pin.name, version=pin.version, wheels=(wheel,)))
    packages.sort(key=lambda p: (p.name, p.version or ""))
    try:
        return assembled(
            packages,
            requires_python=f"=={target.python}.*",
            tool={"envbuilder": dict(inputs)},
            header=(
                f"Generated by {GENERATED_BY}; do not edit.",
                f"Target: Python {target.python}, {target.platform}.",
                *(
                    ("The conformance suite's own dependencies beyond the combination's lock.",)
                    if group == "suite"
                    else ()
                ),
            ),
        )
    except PylockError as e:
        raise ClosureError(str(e)) from e


def lock_requirements(
    combination_id: str,
    packages: Sequence[LockedPackage],
    indexes: Sequence[IndexArgument],
    *,
    group: Literal["suite"] | None = None,
) -> str:
    """``requirements.<id>.txt``: every package pinned with its sha256, for
    ``pip install --require-hashes --no-deps -r``. Non-default indexes are named
    so that pip can find files that are not on the user's own index.
    ``group="suite"``: ``requirements.<id>.suite.txt``, installed after that file."""
    options: list[str] = []
    for index in indexes:
        if index.role == "index":
            options.append(f"--extra-index-url {index.url}")
        elif index.role == "find-links":
            options.append(f"--find-links {index.url}")
    pins: list[tuple[str, str]] = []
    for pkg in sorted(packages, key=lambda p: p.name):
        sha = pkg.archive.sha256 if pkg.archive else None
        if sha is None:
            raise ClosureError(f"{combination_id}: {pkg.name} has no sha256 in its lock")
        pins.append((f"{pkg.name}=={pkg.version}", sha))
    return requirements_text(
        pins,
        header=(
            f"Generated by {GENERATED_BY}; do not edit.",
            f"{combination_id}: pip install --require-hashes --no-deps -r <this file>"
            if group is None
            else f"{combination_id}, the conformance suite's own dependencies: after"
            f" requirements.{combination_id}.txt, pip install --require-hashes --no-deps -r"
            " <this file>",
        ),
        options=options,
    )
