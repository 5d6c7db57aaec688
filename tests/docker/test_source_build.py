"""The hermetic source builder, on a small C-extension sdist, through the same code path as xformers.

The builder image is a debootstrapped Debian with python3, venv, g++ and the
Python headers (no registry is reachable). The build group is setuptools and
wheel, fetched from the configured index once and locked by sha256.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel
from envbuilder.sourcebuild.builder import BuildFailed, BuildPlan, build_wheel
from envbuilder.sourcebuild.cache import BuiltWheelCache
from tests.docker.conftest import local_image
from tests.support.sdists import NETWORK_PROBE, c_extension_sdist, locked

BUILDER_IMAGE = "envbuilder-test/builder:bookworm"
BUILD_GROUP = ("setuptools==80.9.0", "wheel==0.45.1")


@pytest.fixture(scope="module")
def builder_image(docker_client: Any) -> str:
    return local_image(docker_client, BUILDER_IMAGE, "g++", "python3-dev")


@pytest.fixture(scope="module")
def build_group(tmp_path_factory: pytest.TempPathFactory) -> tuple[LockedWheel, ...]:
    directory = tmp_path_factory.mktemp("build-group")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
         "-d", str(directory), *BUILD_GROUP],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot fetch {', '.join(BUILD_GROUP)} from the index: {done.stderr[-500:]}")
    wheels = []
    for requirement in BUILD_GROUP:
        name, version = requirement.split("==")
        (path,) = directory.glob(f"{name}-{version}-*.whl")
        wheels.append(locked(path, name, version))
    return tuple(wheels)


def plan_for(sdist: Path, group: tuple[LockedWheel, ...]) -> BuildPlan:
    name = sdist.name.removesuffix("-1.0.tar.gz")
    return BuildPlan(
        combination_id=f"test-{name}",
        python="3.11",
        sdist=locked(sdist, name, "1.0"),
        build_group=group,
        cuda=False,  # a CPU extension: no compiler wheels, no torch
        flags=("DEMO_FLAG=1",),
    )


def test_a_c_extension_is_built_without_network_cached_and_reproducible(
    tmp_path: Path, docker_client: Any, builder_image: str, build_group: tuple[LockedWheel, ...]
) -> None:
    # compiled under a name that differs per build, as nvcc names a .cu file's host code
    plan = plan_for(c_extension_sdist(tmp_path, nvcc_names=True), build_group)
    cache = BuiltWheelCache(tmp_path / "built")
    files = WheelCache(tmp_path / "files")
    log = tmp_path / "build.log"

    def build(**options: Any) -> Any:
        return build_wheel(
            plan, mode="docker", cache=cache, files=files, builder_image=builder_image,
            client=docker_client, log_path=log, jobs=2, **options,
        )  # fmt: skip

    first = build()
    assert not first.hit
    # the container had no network: loopback only
    assert "build.py: network interfaces: lo\n" in log.read_text(encoding="utf-8")
    second = build()
    assert second.hit and second.seconds < 1.0
    assert second.built.sha256 == first.built.sha256
    again = build(force=True)  # the same key built again: the same bytes
    assert not again.hit
    assert again.built.sha256 == first.built.sha256
    data = again.built.path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == again.built.record["wheel"]["sha256"]
    with zipfile.ZipFile(again.built.path) as wheel:
        names = wheel.namelist()
        assert any(n.startswith("envb_demo") and n.endswith(".so") for n in names)
        assert names[-1].endswith(".dist-info/RECORD")
        assert {i.date_time for i in wheel.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    record = again.built.record
    assert record["key"] == first.key.digest
    assert record["key_inputs"]["builder"].startswith("image:sha256:")
    assert record["key_inputs"]["flags"] == ["DEMO_FLAG=1"]


def test_a_build_that_reaches_for_the_network_fails(
    tmp_path: Path, docker_client: Any, builder_image: str, build_group: tuple[LockedWheel, ...]
) -> None:
    plan = plan_for(c_extension_sdist(tmp_path, "envb-probe", probe=NETWORK_PROBE), build_group)
    with pytest.raises(BuildFailed) as failed:
        build_wheel(
            plan, mode="docker", cache=BuiltWheelCache(tmp_path / "built"),
            files=WheelCache(tmp_path / "files"), builder_image=builder_image,
            client=docker_client, log_path=tmp_path / "build.log",
        )  # fmt: skip
    # no route at all (network none), not a timeout or a refusal on some network
    assert "network probe: [Errno 101] Network is unreachable" in str(failed.value)
