"""An image of a source-build combination installs the wheel its build record names.

The lock holds torch and xformers' run-time requirements, not xformers: the image's
``rest`` layer adds the built wheel from the build cache, hash-pinned. Without a
record, or without its wheel in the cache, the build stops and says how to get one;
it never compiles xformers itself.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.plan import LockedWheel, install_requirements, plan_layers, with_built_wheel
from envbuilder.errors import InputError
from envbuilder.lockfile.sourcebuilds import record_name
from envbuilder.model import (
    BuildRecord,
    ResolvedCombination,
    ResolvedXformers,
    SourceBuild,
    SourceFile,
)
from envbuilder.sourcebuild.cache import RECORD_SCHEMA
from envbuilder.sourcebuild.image import built_wheel_for_image
from envbuilder.sourcebuild.key import KEY_FORMAT
from envbuilder.target import CudaTag
from tests.support.cells import cell

ID = "py3.12-cu130-torch2.11.0-xformers0.0.35"
SDIST = "5" * 64
KEY = "e608dfda6e02" + "0" * 52
WHEEL = "xformers-0.0.35-py39-none-linux_x86_64.whl"
BUILD = SourceBuild(
    sdist=SourceFile(
        filename="xformers-0.0.35.tar.gz", url="https://x.invalid/x.tar.gz", sha256=SDIST
    ),
    why="no wheel fits: built for CUDA 12.8",
    cuda=CudaTag(13, 0),
    arch_list=("9.0",),
    flags=("TORCH_CUDA_ARCH_LIST=9.0",),
    build_requirements_in=("setuptools>=64",),
)
RESOLVED = ResolvedCombination(
    combination=cell(ID),
    status="resolved",
    reason="xformers 0.0.35 built from source",
    xformers=ResolvedXformers(
        version="0.0.35",
        filename="xformers-0.0.35.tar.gz",
        url="https://x.invalid/x.tar.gz",
        sha256=SDIST,
        requires_torch=">=2.10",
        built_with=BuildRecord(torch="", cuda=None, arch_list=""),
    ),
    source_build=BUILD,
)
TORCH = LockedWheel(
    name="torch",
    version="2.11.0",
    filename="torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    url="https://x.invalid/torch.whl",
    sha256="7" * 64,
)


def built(tmp_path: Path, content: bytes = b"the built and measured wheel") -> tuple[Path, str]:
    """A build record beside the locks and its wheel in the build cache; (locks, sha256)."""
    locks, cache = tmp_path / "locks", tmp_path / "source-builds"
    (cache / KEY).mkdir(parents=True)
    (cache / KEY / WHEEL).write_bytes(content)
    sha = hashlib.sha256(content).hexdigest()
    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "combination": ID,
        "key": KEY,
        "key_inputs": {"format": KEY_FORMAT, "sdist_sha256": SDIST, "arch_list": ["9.0"]},
        "mode": "docker",
        "toolchain": "wheels",
        "wheel": {"filename": WHEEL, "sha256": sha, "size": len(content)},
        "cpp_lib": None,
    }
    locks.mkdir()
    (locks / record_name(ID)).write_text(json.dumps(record))
    return locks, sha


def wheel_for(tmp_path: Path, locks: Path) -> LockedWheel | None:
    return built_wheel_for_image(
        RESOLVED, locks / "pylock.toml", build_cache=tmp_path / "source-builds", records=[locks]
    )


def test_the_image_installs_the_recorded_wheel_hash_pinned_in_the_rest_layer(
    tmp_path: Path,
) -> None:
    locks, sha = built(tmp_path)
    wheel = wheel_for(tmp_path, locks)
    assert wheel is not None
    assert (wheel.name, wheel.version, wheel.filename, wheel.sha256) == (
        "xformers",
        "0.0.35",
        WHEEL,
        sha,
    )
    assert wheel.url == (tmp_path / "source-builds" / KEY / WHEEL).resolve().as_uri()
    plan = plan_layers(with_built_wheel([TORCH], wheel))
    assert plan.groups["torch"] == (TORCH,) and plan.groups["rest"] == (wheel,)
    assert f"xformers==0.0.35 --hash=sha256:{sha}" in install_requirements(plan.groups["rest"])


def test_a_combination_whose_xformers_is_a_wheel_from_an_index_adds_nothing(
    tmp_path: Path,
) -> None:
    plain = ResolvedCombination(**{**RESOLVED.__dict__, "source_build": None})
    assert built_wheel_for_image(plain, tmp_path / "pylock.toml", build_cache=tmp_path) is None
    assert with_built_wheel([TORCH], None) == (TORCH,)


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        ("no record", "no build record of it is in {locks}: build the wheel first "
         f"(`envbuilder build-wheel {ID}`), and the image installs it; an image build never "
         "compiles xformers itself"),
        ("no wheel", f"names the wheel {WHEEL} (key {KEY[:12]}), and the build cache "
         "{cache} does not hold it"),
        ("other bytes", "has sha256 {other}, not the {sha} its build record"),
    ],
)  # fmt: skip
def test_without_the_recorded_wheel_the_image_build_stops_saying_how(
    tmp_path: Path, break_it: str, says: str
) -> None:
    locks, sha = built(tmp_path)
    wheel = tmp_path / "source-builds" / KEY / WHEEL
    if break_it == "no record":
        (locks / record_name(ID)).unlink()
    elif break_it == "no wheel":
        wheel.unlink()
    else:
        wheel.write_bytes(b"a rebuild: other bytes")
    with pytest.raises(InputError) as e:
        wheel_for(tmp_path, locks)
    other = hashlib.sha256(b"a rebuild: other bytes").hexdigest()
    expected = says.format(locks=locks, cache=tmp_path / "source-builds", other=other, sha=sha)
    assert expected in " ".join(str(e.value).split())


def test_a_lock_that_holds_the_project_too_is_refused() -> None:
    xformers = LockedWheel(
        name="xformers", version="0.0.35", filename="xformers-0.0.35-py39-none-manylinux_2_28_x86_64.whl",
        url="https://x.invalid/xformers.whl", sha256="8" * 64,
    )  # fmt: skip
    built = LockedWheel(**{**xformers.__dict__, "filename": WHEEL, "sha256": "9" * 64})
    with pytest.raises(InputError, match="one xformers only; resolve again"):
        with_built_wheel([TORCH, xformers], built)


def test_an_image_request_of_a_source_build_without_its_wheel_is_refused(tmp_path: Path) -> None:
    """`ensure_image` installs only the wheel its caller looked up by the build record: a
    request without one stops before any Docker call, instead of an image without xformers."""
    from envbuilder.docker.build import ImageRequest, ensure_image
    from envbuilder.docker.cache import WheelCache
    from envbuilder.docker.plan import lock_digest

    lock = tmp_path / "pylock.toml"
    lock.write_bytes(b'lock-version = "1.0"\ncreated-by = "envbuilder"\npackages = []\n')
    resolved = ResolvedCombination(
        **{**RESOLVED.__dict__, "lock_sha256": lock_digest(lock.read_bytes())}
    )
    request = ImageRequest(
        resolved=resolved, lock_path=lock, log_dir=tmp_path, cache=WheelCache(tmp_path / "wheels")
    )
    with pytest.raises(
        InputError, match="builds xformers from source, and no built wheel was given"
    ):
        ensure_image(request)
