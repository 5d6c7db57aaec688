"""The full dependency closure of a decided combination, computed by uv.

envbuilder decides torch and xformers itself (from the evidence in the
wheels); the generic part — every other dependency, for a target that is
not the host — is uv's job. The result is written as a PEP 751
``pylock.<id>.toml`` and a ``requirements.<id>.txt`` for
``pip install --require-hashes``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from packaging.pylock import (
    PackageSdist,
    PackageWheel,
    Pylock,
    PylockSelectError,
    PylockValidationError,
)

from envbuilder.errors import EnvbuilderError, MissingToolError
from envbuilder.target import Target

__all__ = [
    "GENERATED_BY",
    "ClosureError",
    "IndexArgument",
    "LockedPackage",
    "PinnedFile",
    "assemble_lock",
    "compile_closure",
    "find_uv",
    "lock_inputs",
    "locked_packages",
    "parse_lock",
    "read_lock_inputs",
    "requirements_text",
    "select_for_target",
]

logger = logging.getLogger(__name__)

GENERATED_BY = "nox -s resolve (envbuilder resolve)"


class ClosureError(EnvbuilderError):
    """uv could not compute the closure; the message carries uv's own explanation."""


@dataclass(frozen=True, kw_only=True)
class IndexArgument:
    """An index handed to uv: ``default`` (lowest priority), ``index`` or ``find-links``."""

    role: str  # "default" | "index" | "find-links"
    url: str

    def argv(self) -> list[str]:
        flag = {"default": "--default-index", "index": "--index", "find-links": "--find-links"}
        return [flag[self.role], self.url]


@dataclass(frozen=True, kw_only=True)
class LockedPackage:
    name: str
    version: str
    filename: str | None
    url: str | None
    sha256: str | None
    size: int | None


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
        raise MissingToolError(
            "uv is needed to compute dependency closures: `python -m pip install uv`"
        ) from e


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
    uv: str,
    offline: bool = False,
    ca_bundle: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``uv pip compile --universal`` from ``python_floor`` up; return its PEP 751 document.

    One universal resolution serves every target that shares the same
    requirements (the Python versions of one torch/xformers pair): each
    target then takes its own packages with `select_for_target`.
    """
    if not requirements:
        return {"lock-version": "1.0", "created-by": "uv", "packages": []}
    env = dict(os.environ if environ is None else environ)
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
    if ca_bundle:
        env["SSL_CERT_FILE"] = ca_bundle
    with tempfile.TemporaryDirectory(prefix="envbuilder-uv-") as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
        out = Path(tmp) / "pylock.toml"
        argv = [
            uv, "pip", "compile", str(req_in),
            "--universal",
            "--python-version", python_floor,
            "--generate-hashes",
            "--format", "pylock.toml",
            "--no-header",
            "--quiet",
            "-o", str(out),
        ]  # fmt: skip
        for index in indexes:
            argv += index.argv()
        if offline:
            argv.append("--offline")
        logger.debug("running %s", argv)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip()
            raise ClosureError(f"uv could not resolve {', '.join(requirements)}: {message}")
        return tomllib.loads(out.read_text(encoding="utf-8"))


def select_for_target(closure: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """The target's part of a universal lock: each package whose marker holds, with the
    one archive that fits the target's tags (PEP 751 selection, by ``packaging.pylock``)."""
    try:
        lock = Pylock.from_dict(closure)
        chosen = list(lock.select(environment=target.marker_environment, tags=target.tags))  # type: ignore[arg-type]
    except (PylockValidationError, PylockSelectError) as e:
        raise ClosureError(f"no closure for {target.describe()}: {e}") from e
    packages: list[dict[str, Any]] = []
    for package, archive in chosen:
        if not isinstance(archive, PackageWheel | PackageSdist):
            raise ClosureError(f"{package.name}: envbuilder locks only wheels and sdists")
        entry: dict[str, Any] = {"url": archive.url, "hashes": dict(archive.hashes)}
        if archive.name:
            entry["name"] = archive.name
        if archive.size is not None:
            entry["size"] = archive.size
        kind = "wheels" if isinstance(archive, PackageWheel) else "sdist"
        packages.append(
            {
                "name": str(package.name),
                "version": str(package.version),
                kind: [entry] if kind == "wheels" else entry,
            }
        )
    return {"packages": packages}


@dataclass(frozen=True, kw_only=True)
class PinnedFile:
    """A file envbuilder chose itself (torch, xformers) and adds to uv's closure."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None


def assemble_lock(
    closure: Mapping[str, Any],
    *,
    pinned: Sequence[PinnedFile],
    inputs: Mapping[str, Any],
    target: Target,
) -> str:
    """The PEP 751 text of uv's closure plus the pinned files, sorted, with envbuilder's header."""
    packages = [dict(p) for p in closure.get("packages", [])]
    names = {p["name"] for p in packages}
    for pin in pinned:
        if pin.name in names:
            raise ClosureError(
                f"the dependencies of the chosen wheels pull in another {pin.name}; "
                f"envbuilder pins {pin.filename}"
            )
        wheel: dict[str, Any] = {
            "name": pin.filename,
            "url": pin.url,
            "hashes": {"sha256": pin.sha256},
        }
        if pin.size is not None:
            wheel["size"] = pin.size
        packages.append({"name": pin.name, "version": pin.version, "wheels": [wheel]})
    packages.sort(key=lambda p: (p["name"], p.get("version", "")))
    doc: dict[str, Any] = {
        "lock-version": "1.0",
        "created-by": "envbuilder",
        "requires-python": f"=={target.python}.*",
        "packages": packages,
        "tool": {"envbuilder": dict(inputs)},
    }
    try:
        Pylock.from_dict(doc)
    except PylockValidationError as e:
        raise ClosureError(f"the assembled lock is not valid PEP 751: {e}") from e
    header = (
        f"# Generated by {GENERATED_BY}; do not edit.\n"
        f"# Target: Python {target.python}, {target.platform}.\n"
    )
    return header + tomli_w.dumps(doc)


def parse_lock(text: str) -> dict[str, Any] | None:
    """The TOML document of a lock, or None when it is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def read_lock_inputs(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The inputs recorded in a lock's ``[tool.envbuilder]`` table."""
    tool = doc.get("tool", {}).get("envbuilder")
    return tool if isinstance(tool, dict) else None


def locked_packages(doc: Mapping[str, Any]) -> list[LockedPackage]:
    """The packages of a PEP 751 lock, each with its (single, target-specific) wheel."""
    out: list[LockedPackage] = []
    for pkg in doc.get("packages", []):
        wheels = pkg.get("wheels") or []
        archive = wheels[0] if wheels else (pkg.get("sdist") or {})
        url = archive.get("url")
        filename = archive.get("name") or (url.rsplit("/", 1)[-1] if url else None)
        out.append(
            LockedPackage(
                name=pkg["name"],
                version=pkg.get("version", ""),
                filename=filename,
                url=url,
                sha256=(archive.get("hashes") or {}).get("sha256"),
                size=archive.get("size"),
            )
        )
    return out


def requirements_text(
    combination_id: str, packages: Sequence[LockedPackage], indexes: Sequence[IndexArgument]
) -> str:
    """``requirements.<id>.txt``: every package pinned with its sha256, for
    ``pip install --require-hashes --no-deps -r``. Non-default indexes are named
    so that pip can find files that are not on the user's own index."""
    lines = [
        f"# Generated by {GENERATED_BY}; do not edit.",
        f"# {combination_id}: pip install --require-hashes --no-deps -r <this file>",
    ]
    for index in indexes:
        if index.role == "index":
            lines.append(f"--extra-index-url {index.url}")
        elif index.role == "find-links":
            lines.append(f"--find-links {index.url}")
    for pkg in sorted(packages, key=lambda p: p.name):
        if pkg.sha256 is None:
            raise ClosureError(f"{combination_id}: {pkg.name} has no sha256 in its lock")
        lines.append(f"{pkg.name}=={pkg.version} \\\n    --hash=sha256:{pkg.sha256}")
    return "\n".join(lines) + "\n"
