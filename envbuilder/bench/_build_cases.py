"""The combinations the build benchmark measures and the locks it builds from.

Real mode picks resolved combinations from ``resolve``'s output (named, or three that
share the most layer bytes); synthetic mode generates three locks of reproducible
wheels. Each measured lock also gets a variant whose ``rest`` group alone changes.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import random
import shutil
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from envbuilder.docker.build import lock_path, suite_lock_path
from envbuilder.docker.plan import GROUPS, install_requirements, load_lock, lock_digest, plan_layers
from envbuilder.errors import InputError
from envbuilder.files import atomic_writer, sha256_file
from envbuilder.model import Combination, ResolvedCombination, ResolvedTorch, load_resolution
from envbuilder.target import CudaTag

__all__ = [
    "MB",
    "Case",
    "cases_sharing_a_runtime",
    "named_cases",
    "rest_changed",
    "synthetic_cases",
]

MB = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Case:
    resolved: ResolvedCombination
    lock: Path


def rest_changed(case: Case, *, work: Path, version: str) -> Case:
    """``case`` with one small wheel added to its lock: only the ``rest`` group changes
    (the suite lock, copied beside it, stays the same)."""
    marker = _wheel(work / "wheels", "envbuilder-bench-marker", version, 1024, seed=99)
    document = tomllib.loads(case.lock.read_text(encoding="utf-8"))
    document["packages"] = [
        *document["packages"],
        {
            "name": "envbuilder-bench-marker",
            "version": version,
            "wheels": [
                {
                    "url": marker.as_uri(),
                    "size": marker.stat().st_size,
                    "hashes": {"sha256": sha256_file(marker)},
                }
            ],
        },
    ]
    lock = work / version / case.lock.name
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(tomli_w.dumps(document), encoding="utf-8")
    suite = suite_lock_path(case.resolved, case.lock)
    if suite is not None:
        shutil.copyfile(suite, lock.parent / suite.name)
    resolved = dataclasses.replace(
        case.resolved, lock=str(lock), lock_sha256=lock_digest(lock.read_bytes())
    )
    return Case(resolved=resolved, lock=lock)


def named_cases(locks: Path, ids: Sequence[str]) -> list[Case]:
    """The resolved combinations ``ids`` of ``locks/resolution.json``."""
    resolved = load_resolution(locks / "resolution.json").by_id()
    cases: list[Case] = []
    for cid in ids:
        rc = resolved.get(cid)
        if rc is None or rc.status != "resolved":
            raise InputError(
                f"{locks / 'resolution.json'}: {cid!r} is not a resolved combination there"
            )
        cases.append(Case(resolved=rc, lock=lock_path(rc, locks)))
    return cases


def cases_sharing_a_runtime(locks: Path, *, python: str | None = None) -> list[Case]:
    """Three resolved CUDA combinations of one Python and one CUDA (so one base image) whose
    layers would share the most bytes. A layer is shared only where it and every layer below
    it hold the same wheels, so the pick weighs each layer's chain, by the locks' wheel sizes."""
    resolution = load_resolution(locks / "resolution.json")
    groups: dict[tuple[str, str], list[tuple[Case, dict[tuple[str, ...], int]]]] = {}
    for rc in resolution.combinations:
        if rc.status != "resolved" or rc.cuda == "cpu" or python not in (None, rc.python):
            continue
        lock = lock_path(rc, locks)
        plan = plan_layers(load_lock(lock.read_bytes(), source=lock))
        chains: dict[tuple[str, ...], int] = {}
        chain: tuple[str, ...] = ()
        for group in GROUPS:
            chain = (*chain, install_requirements(plan.groups[group]))
            chains[chain] = sum(w.size or 0 for w in plan.groups[group])
        groups.setdefault((rc.python, rc.cuda), []).append((Case(resolved=rc, lock=lock), chains))

    def saved(triple: tuple[tuple[Case, dict[tuple[str, ...], int]], ...]) -> int:
        unique: dict[tuple[str, ...], int] = {}
        for _, chains in triple:
            unique.update(chains)
        return sum(sum(chains.values()) for _, chains in triple) - sum(unique.values())

    triples = [t for members in groups.values() for t in itertools.combinations(members, 3)]
    if not triples:
        raise InputError(
            f"{locks}: no three resolved CUDA combinations of one Python and CUDA; "
            "resolve more (`nox -s resolve`) or use --synthetic"
        )
    return [case for case, _ in max(triples, key=saved)]


def synthetic_cases(work: Path, *, runtime_mb: int, torch_mb: int) -> list[Case]:
    """Three locks of generated wheels: shared runtime group, distinct torch, small rest."""
    wheels = work / "wheels"
    runtime = [
        _wheel(wheels, "nvidia-bench-cublas-cu12", "12.8.1", runtime_mb * 3 // 4 * MB, seed=1),
        _wheel(wheels, "nvidia-bench-runtime-cu12", "12.8.2", runtime_mb // 4 * MB, seed=2),
    ]
    common = _wheel(wheels, "bench-common", "1.0", 1 * MB, seed=3)
    cases: list[Case] = []
    for i, torch_version in enumerate(("9.0.0", "9.1.0", "9.2.0")):
        combination_id = f"bench-synthetic-torch{torch_version}"
        torch = _wheel(wheels, "torch", torch_version, torch_mb * MB, seed=10 + i)
        xformers = _wheel(wheels, "xformers", f"0.0.{90 + i}", 2 * MB, seed=20 + i)
        lock = work / "locks" / f"pylock.{combination_id}.toml"
        _write_lock(lock, [*runtime, torch, xformers, common])
        resolved = ResolvedCombination(
            combination=Combination(
                id=combination_id,
                python="3.11",
                cuda=CudaTag(12, 8),
                torch=torch_version,
                xformers=f"0.0.{90 + i}",
            ),
            status="resolved",
            reason="synthetic benchmark combination",
            torch=ResolvedTorch(
                version=torch_version,
                cuda=CudaTag(12, 8),
                cuda_source="requires-dist",
                filename=torch.name,
                url=torch.as_uri(),
                sha256=sha256_file(torch),
            ),
            lock=str(lock),
            lock_sha256=lock_digest(lock.read_bytes()),
        )
        cases.append(Case(resolved=resolved, lock=lock))
    return cases


def _write_lock(path: Path, wheels: Sequence[Path]) -> None:
    packages = []
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        packages.append(
            {
                "name": name.replace("_", "-"),
                "version": version,
                "wheels": [
                    {
                        "url": wheel.as_uri(),
                        "size": wheel.stat().st_size,
                        "hashes": {"sha256": sha256_file(wheel)},
                    }
                ],
            }
        )
    document = {"lock-version": "1.0", "created-by": "envbuilder-bench", "packages": packages}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(document), encoding="utf-8")


#: `random.Random.randbytes` takes at most 2**28 - 1 bytes a call (its bits must fit a C int).
_RANDOM_PIECE = 2**28 - 1


def _random_bytes(size: int, *, seed: int) -> bytes:
    """``size`` reproducible random bytes (the CUDA-sized payloads in pieces)."""
    rng = random.Random(seed)
    return b"".join(
        rng.randbytes(min(_RANDOM_PIECE, size - i)) for i in range(0, size, _RANDOM_PIECE)
    )


def _wheel(directory: Path, name: str, version: str, payload: int, *, seed: int) -> Path:
    """A real, reproducible wheel of ``payload`` incompressible bytes (stored, not deflated)."""
    module = name.replace("-", "_")
    path = directory / f"{module}-{version}-py3-none-any.whl"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{module}-{version}.dist-info"
    members = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{module}/payload.bin": _random_bytes(payload, seed=seed),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envbuilder-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in members.items()
    ]
    members[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    with atomic_writer(path) as f, zipfile.ZipFile(f, "w") as archive:
        for member, data in members.items():
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            archive.writestr(info, data)
    return path
