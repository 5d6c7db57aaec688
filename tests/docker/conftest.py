"""Fixtures for tests against a real Docker daemon.

No registry is reachable, so the base image is made here: ``envbuilder/docker/recipe/make-base.sh``
debootstraps a minimal Debian with Python 3.11 from this machine's apt mirror
and imports it (once; later runs reuse the image). The real combination is
the CPU build of torch 2.13.0 for Python 3.11, locked with real uv from pip's
find-links (where that wheel lies) and the configured index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from envbuilder.docker.build import DOCKER_DIR, lock_path
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import lock_digest
from envbuilder.index.pipconfig import default_index_url, pip_config_value
from envbuilder.model import (
    Resolution,
    ResolvedCombination,
    ResolvedTorch,
    lock_filename,
    suite_lock_filename,
    suite_requirements_filename,
)
from tests.support.cells import cell
from tests.support.wheels import BuiltWheel

BASE_IMAGE = "envbuilder-test/python:3.11"
#: the workflow rehearsal's runner image: the base's python3 and bash, and these packages
RUNNER_IMAGE = "envbuilder-test/runner:bookworm"
RUNNER_PACKAGES = ("git", "curl", "ca-certificates")
TORCH_ID = "py3.11-cpu-torch2.13.0"
TORCH_VERSION = "2.13.0"
#: the conformance suite's own dependency, locked beside the combination's lock
DIFFUSERS_VERSION = "0.42.1"


@dataclass(frozen=True, kw_only=True)
class Locked:
    """A combination's resolution record and its lock on disk."""

    resolved: ResolvedCombination
    lock: Path


@pytest.fixture(scope="session")
def docker_client() -> Any:
    from docker.client import DockerClient
    from docker.errors import DockerException

    try:
        client = DockerClient.from_env(timeout=3600)
        client.ping()
    except DockerException as e:
        pytest.skip(f"no Docker daemon ({e}); `sudo bash .ci/setup` installs and starts one")
    return client


def local_image(client: Any, tag: str, *packages: str) -> str:
    """``tag``, debootstrapped by ``envbuilder/docker/recipe/make-base.sh`` (with ``packages``) when absent."""
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
        return tag
    except ImageNotFound:
        pass
    if shutil.which("debootstrap") is None:
        pytest.skip(f"{tag} is absent and debootstrap is not installed (sudo bash .ci/setup)")
    if os.geteuid() != 0:
        pytest.skip(f"{tag} is absent and debootstrap needs root")
    make = [str(DOCKER_DIR / "make-base.sh"), tag, "bookworm", *packages]
    subprocess.run(["bash", *make], check=True)
    return tag


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    return local_image(docker_client, BASE_IMAGE)


@pytest.fixture(scope="session")
def runner_image(docker_client: Any) -> str:
    """What a hosted runner has before any step: python3 (with venv), git, curl, bash."""
    return local_image(docker_client, RUNNER_IMAGE, *RUNNER_PACKAGES)


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> WheelCache:
    return WheelCache(tmp_path_factory.mktemp("wheel-cache"))


def resolved_record(
    combination_id: str, lock: Path, *, torch: str, cuda: str = "cpu"
) -> ResolvedCombination:
    return ResolvedCombination(
        combination=cell(combination_id, python="3.11", cuda=cuda, torch=torch.partition("+")[0]),
        status="resolved",
        reason="",
        torch=ResolvedTorch(
            version=torch, cuda=None, cuda_source="none", filename="", url="", sha256="0" * 64
        ),
        lock=f"{lock.parent.name}/{lock.name}",  # relative to the output's parent (docs/contracts.md)
        lock_sha256=lock_digest(lock.read_bytes()),
    )


def write_lock(path: Path, wheels: Sequence[BuiltWheel]) -> Path:
    """A PEP 751 lock of exactly these wheels, by file URL."""
    document = {
        "lock-version": "1.0",
        "created-by": "envbuilder-tests",
        "requires-python": ">=3.11",
        "packages": [
            {
                "name": w.name,
                "version": w.version,
                "wheels": [
                    {"url": w.path.as_uri(), "size": w.size, "hashes": {"sha256": w.sha256}}
                ],
            }
            for w in wheels
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(document), encoding="utf-8")
    return path


@pytest.fixture
def synthetic_lock(
    tmp_path: Path, docker_client: Any
) -> Iterator[Callable[[str, Sequence[BuiltWheel]], Locked]]:
    """Make a lock of test-built wheels; images built from such locks are removed afterwards."""
    made: list[str] = []

    def make(combination_id: str, wheels: Sequence[BuiltWheel]) -> Locked:
        lock = write_lock(tmp_path / "locks" / lock_filename(combination_id), wheels)
        made.append(combination_id)
        torch = next((w.version for w in wheels if w.name == "torch"), "0")
        return Locked(resolved=resolved_record(combination_id, lock, torch=torch), lock=lock)

    yield make
    for combination_id in made:
        for image in docker_client.images.list(name=f"envbuilder/{combination_id}"):
            docker_client.images.remove(image.id, force=True)


@pytest.fixture(scope="session")
def torch_locks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``locks/`` for the real combination: pylock, resolution.json and a matrix with its base image."""
    find_links = pip_config_value("find-links")
    wheels = [
        f
        for d in (find_links or "").split()
        if Path(d).is_dir()
        for f in Path(d).glob(f"torch-{TORCH_VERSION}+cpu-cp311-*.whl")
    ]
    if not wheels:
        pytest.skip(
            f"no CPU wheel of torch {TORCH_VERSION} for cp311 in pip's find-links ({find_links!r})"
        )
    root = tmp_path_factory.mktemp("torch")
    locks = root / "locks"
    locks.mkdir()
    lock = locks / lock_filename(TORCH_ID)
    uv_lock(root, [f"torch=={TORCH_VERSION}"], wheels[0].parent, lock)
    # The suite's group: diffusers' closure, resolved together with the combination's pins
    # (one version of every project), written as the packages the main lock lacks.
    both = root / "pylock.with-suite.toml"
    uv_lock(
        root, [f"torch=={TORCH_VERSION}", f"diffusers=={DIFFUSERS_VERSION}"], wheels[0].parent, both
    )
    write_suite_lock(lock, both, TORCH_ID)
    matrix = root / "matrix.toml"
    matrix.write_text(
        "[defaults]\n"
        'base-image = "envbuilder-test/python:{python}"\n'
        '[axes]\npython = ["3.11"]\n'
        '[[combinations]]\npython = "3.11"\ncuda = "cpu"\ntorch = "2.13.0"\n'
        '[[combinations]]\npython = "3.11"\ncuda = "cpu"\ntorch = "2.12.0"\n',
        encoding="utf-8",
    )
    resolution = Resolution(
        matrix=str(matrix),
        matrix_sha256=lock_digest(matrix.read_bytes()),
        combinations=(
            resolved_record(TORCH_ID, lock, torch=f"{TORCH_VERSION}+cpu"),
            ResolvedCombination(
                combination=cell("py3.11-cpu-torch2.12.0"),
                status="unsatisfiable",
                reason="no torch 2.12.0 wheel for cp311 on any index",
            ),
        ),
    )
    import json

    document = resolution.to_json()
    for entry in document["combinations"]:  # the suite group's files, as the resolver names them
        suite = entry["combination"]["id"] == TORCH_ID
        entry["suite_lock"] = f"locks/{suite_filename(TORCH_ID, 'pylock')}" if suite else None
        entry["suite_requirements"] = (
            f"locks/{suite_filename(TORCH_ID, 'requirements')}" if suite else None
        )
    (locks / "resolution.json").write_text(json.dumps(document, indent=2), encoding="utf-8")
    return locks


def uv_lock(root: Path, requirements: Sequence[str], find_links: Path, out: Path) -> None:
    """Lock ``requirements`` for the target with real uv into the PEP 751 lock ``out``."""
    (root / "requirements.in").write_text("\n".join(requirements) + "\n", encoding="utf-8")
    beside = Path(sys.executable).parent / "uv"
    uv = str(beside) if beside.exists() else shutil.which("uv") or "uv"
    command = [
        uv, "pip", "compile", "--quiet", "--format", "pylock.toml", "--generate-hashes",
        "--only-binary", ":all:",  # envbuilder's lock readers refuse sdists
        "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
        "--default-index", default_index_url(), "--find-links", str(find_links),
        "--no-header", str(root / "requirements.in"), "-o", str(root / "pylock.toml"),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    )
    if done.returncode != 0:
        if "connect" in done.stderr or "Failed to fetch" in done.stderr:
            pytest.skip(
                f"uv could not reach the index to lock {requirements}: {done.stderr[-500:]}"
            )
        pytest.fail(f"uv could not lock {requirements}: {done.stderr[-2000:]}")
    (root / "pylock.toml").replace(out)  # uv only writes pylock.toml / pylock.<name>.toml


def suite_filename(combination_id: str, kind: str) -> str:
    """The suite lock's names beside the combination's, as resolve writes them."""
    if kind == "pylock":
        return suite_lock_filename(combination_id)
    return suite_requirements_filename(combination_id)


def one_wheel(wheels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The one wheel of a package for CPython 3.11 on manylinux x86_64 (uv lists every
    wheel that fits the platform): the pure one, else the first binary one."""
    from packaging.utils import parse_wheel_filename

    def name(wheel: dict[str, Any]) -> str:
        return str(wheel.get("name") or wheel["url"].rsplit("/", 1)[-1])

    fits = [
        w
        for w in wheels
        if any(
            (t.interpreter in ("py3", "cp311") or t.abi == "abi3") and t.platform in ("any", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
            for t in parse_wheel_filename(name(w))[3]
        )
    ]  # fmt: skip
    pure = [w for w in fits if name(w).endswith("-none-any.whl")]
    return (pure or fits or list(wheels))[0]


def write_suite_lock(main: Path, both: Path, combination_id: str) -> None:
    """The combination's suite lock and requirements beside its lock ``main``: the packages
    of ``both`` that ``main`` does not hold."""
    import tomllib

    held = {p["name"] for p in tomllib.loads(main.read_text(encoding="utf-8"))["packages"]}
    document = tomllib.loads(both.read_text(encoding="utf-8"))
    document["packages"] = [
        {**p, "wheels": [one_wheel(p["wheels"])]}
        for p in document["packages"]
        if p["name"] not in held
    ]
    out = main.with_name(suite_filename(combination_id, "pylock"))
    out.write_text(tomli_w.dumps(document), encoding="utf-8")
    lines = [
        f"{p['name']}=={p['version']} --hash=sha256:{p['wheels'][0]['hashes']['sha256']}\n"
        for p in document["packages"]
    ]
    (out.parent / suite_filename(combination_id, "requirements")).write_text(
        "".join(lines), encoding="utf-8"
    )


@pytest.fixture(scope="session")
def torch_combination(torch_locks: Path) -> Locked:
    from envbuilder.model import load_resolution

    resolved = load_resolution(torch_locks / "resolution.json").by_id()[TORCH_ID]
    return Locked(resolved=resolved, lock=lock_path(resolved, torch_locks))
