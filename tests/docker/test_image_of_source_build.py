"""An image of a source-build combination installs the built wheel its build record names.

The lock holds the run-time closure (here a stand-in torch), not xformers; the built
wheel comes from the build cache, hash-pinned, into the ``rest`` layer. Other bytes
under the record's key stop the build: it never compiles nor takes another wheel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.build import ImageRequest, ensure_image
from envbuilder.docker.cache import WheelCache
from envbuilder.errors import InputError
from envbuilder.lockfile.sourcebuilds import record_name
from envbuilder.model import SourceBuild, SourceFile
from envbuilder.reporter import Reporter
from envbuilder.sourcebuild.cache import RECORD_SCHEMA
from envbuilder.sourcebuild.image import image_wheel
from envbuilder.sourcebuild.key import KEY_FORMAT
from envbuilder.target import CudaTag
from tests.docker.conftest import Locked
from tests.support.wheels import BuiltWheel, build_wheel

SDIST = "5" * 64
BUILD = SourceBuild(
    sdist=SourceFile(filename="xformers-0.0.35.tar.gz", url="https://x.invalid/x.tar.gz", sha256=SDIST),
    why="no wheel fits",
    cuda=CudaTag(13, 0),
    arch_list=("9.0",),
    flags=("TORCH_CUDA_ARCH_LIST=9.0",),
    build_requirements_in=("setuptools>=64",),
)  # fmt: skip

PROBE = """
import importlib.metadata as md, json, xformers
print(json.dumps({"version": md.version("xformers"), "built": xformers.BUILT}))
"""


def recorded(locks: Path, cache: Path, combination: str, wheel: BuiltWheel) -> str:
    """*wheel* in the build cache under a key, and its build record beside the locks."""
    key = hashlib.sha256(combination.encode()).hexdigest()
    (cache / key).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel.path, cache / key / wheel.path.name)
    record = {
        "schema": RECORD_SCHEMA,
        "combination": combination,
        "key": key,
        "key_inputs": {"format": KEY_FORMAT, "sdist_sha256": SDIST, "arch_list": ["9.0"]},
        "mode": "docker",
        "toolchain": "wheels",
        "wheel": {"filename": wheel.path.name, "sha256": wheel.sha256, "size": wheel.size},
        "cpp_lib": None,
    }
    (locks / record_name(combination)).write_text(json.dumps(record))
    return key


def test_the_image_installs_the_recorded_built_wheel_and_never_another(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
) -> None:
    combination = "test-source-build"
    runtime = [build_wheel(tmp_path / "wheels", "torch", "9.7.0", seed=71)]
    locked = synthetic_lock(combination, runtime)
    resolved = dataclasses.replace(locked.resolved, source_build=BUILD)
    built = build_wheel(
        tmp_path / "built", "xformers", "0.0.35", tags="py39-none-linux_x86_64",
        members={"xformers/__init__.py": b"BUILT = 'from its sdist'\n"},
    )  # fmt: skip
    cache = wheel_cache.root.parent / "source-builds"
    key = recorded(locked.lock.parent, cache, combination, built)

    def build() -> str:
        request = ImageRequest(
            resolved=resolved, lock_path=locked.lock, base_image=base_image,
            log_dir=tmp_path / "logs", cache=wheel_cache,
            built_wheel=image_wheel(resolved, locked.lock, wheel_cache),
        )  # fmt: skip
        return ensure_image(request, reporter=Reporter(verbose=1))

    tag = build()
    out = docker_client.containers.run(
        tag, ["python", "-c", PROBE], network_mode="none", remove=True
    )
    assert json.loads(out) == {"version": "0.0.35", "built": "from its sdist"}
    # a rebuild's other bytes under the record's key: the image build stops, saying so
    other = build_wheel(
        tmp_path / "rebuilt", "xformers", "0.0.35", tags="py39-none-linux_x86_64",
        members={"xformers/__init__.py": b"BUILT = 'another build'\n"},
    )  # fmt: skip
    shutil.copyfile(other.path, cache / key / built.path.name)
    with pytest.raises(InputError, match=f"has sha256 {other.sha256}, not the {built.sha256}"):
        build()
    # without the build record there is nothing to install: it says to build the wheel first
    (locked.lock.parent / record_name(combination)).unlink()
    with pytest.raises(InputError, match="build the wheel first"):
        build()
