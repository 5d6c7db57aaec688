"""The target: its platforms, tags and marker environment, uv's spelling of it, CUDA tags."""

from __future__ import annotations

import re

import pytest
from packaging.tags import Tag

from envbuilder.target import (
    CudaTag,
    Target,
    cuda_tag_of,
    normalise_cuda,
    not_in_images,
    unsupported_platform,
)

PY311 = Target(python="3.11", platform="manylinux_2_28_x86_64")

# -- the target's platforms and tags --------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "accepted"),
    [
        ("manylinux_2_28_x86_64", True),
        ("manylinux_2_27_x86_64", True),
        ("manylinux_2_17_x86_64", True),
        ("manylinux2014_x86_64", True),
        ("manylinux2010_x86_64", True),
        ("manylinux1_x86_64", True),
        ("linux_x86_64", True),
        ("manylinux_2_29_x86_64", False),
        ("manylinux_2_34_x86_64", False),
        ("manylinux2014_aarch64", False),
        ("manylinux_2_28_aarch64", False),
        ("musllinux_1_2_x86_64", False),
        ("win_amd64", False),
        ("macosx_11_0_arm64", False),
    ],
)
def test_a_manylinux_2_28_target_accepts_older_manylinux_levels(
    platform: str, accepted: bool
) -> None:
    assert (platform in PY311.platforms) is accepted


def test_platforms_are_ordered_most_specific_first() -> None:
    platforms = PY311.platforms
    assert platforms[0] == "manylinux_2_28_x86_64"
    assert platforms[-1] == "linux_x86_64"
    assert platforms.index("manylinux_2_17_x86_64") < platforms.index("manylinux1_x86_64")


@pytest.mark.parametrize(
    ("tag", "accepted"),
    [
        ("cp311-cp311-manylinux_2_28_x86_64", True),
        ("cp311-cp311-manylinux2014_x86_64", True),
        ("cp311-cp311-linux_x86_64", True),
        ("cp39-abi3-manylinux_2_28_x86_64", True),  # xformers 0.0.31+
        ("py39-none-manylinux_2_28_x86_64", True),  # xformers 0.0.35
        ("py3-none-any", True),
        ("cp311-none-any", True),
        ("cp312-cp312-manylinux_2_28_x86_64", False),
        ("cp310-cp310-manylinux_2_28_x86_64", False),
        ("cp312-abi3-manylinux_2_28_x86_64", False),  # abi3 from a newer Python
        ("cp311-cp311-win_amd64", False),
        ("cp311-none-macosx_11_0_arm64", False),
        ("cp311-cp311-manylinux2014_aarch64", False),
        ("pp311-pypy311_pp73-manylinux_2_28_x86_64", False),
    ],
)
def test_a_cp311_target_accepts_these_tags(tag: str, accepted: bool) -> None:
    assert (Tag(*tag.split("-")) in PY311.tag_priority) is accepted


def test_the_interpreter_specific_tag_is_preferred_over_abi3_and_pure_wheels() -> None:
    order = PY311.tag_priority
    specific = order[Tag("cp311", "cp311", "manylinux_2_28_x86_64")]
    abi3 = order[Tag("cp39", "abi3", "manylinux_2_28_x86_64")]
    pure = order[Tag("py3", "none", "any")]
    assert specific < abi3 < pure


@pytest.mark.parametrize("platform", ["macosx_11_0_universal2", "nonsense", "win_ia64"])
def test_an_unsupported_target_platform_is_an_error_naming_it(platform: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(platform))):
        _ = Target(python="3.11", platform=platform).platforms
    assert repr(platform) in (unsupported_platform(platform) or "")


# -- Windows, macOS and musllinux targets ------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "tag", "accepted"),
    [
        ("win_amd64", "cp311-cp311-win_amd64", True),
        ("win_amd64", "cp39-abi3-win_amd64", True),  # xformers 0.0.31+
        ("win_amd64", "py39-none-win_amd64", True),  # xformers 0.0.34+
        ("win_amd64", "py3-none-any", True),
        ("win_amd64", "cp311-cp311-win32", False),
        ("win_amd64", "cp311-cp311-win_arm64", False),
        ("win_amd64", "cp311-cp311-manylinux_2_28_x86_64", False),
        ("win_amd64", "cp311-cp311-linux_x86_64", False),
        ("macosx_14_0_arm64", "cp311-none-macosx_11_0_arm64", True),  # torch's macOS wheels
        ("macosx_14_0_arm64", "cp311-cp311-macosx_10_9_universal2", True),
        ("macosx_14_0_arm64", "cp311-cp311-macosx_15_0_arm64", False),  # a newer macOS
        ("macosx_14_0_arm64", "cp311-cp311-macosx_11_0_x86_64", False),
        ("macosx_11_0_x86_64", "cp311-cp311-macosx_10_9_x86_64", True),
        ("macosx_11_0_x86_64", "cp311-none-macosx_11_0_arm64", False),
        ("musllinux_1_2_x86_64", "cp311-cp311-musllinux_1_1_x86_64", True),
        ("musllinux_1_2_x86_64", "cp311-cp311-musllinux_1_2_aarch64", False),
        ("musllinux_1_2_x86_64", "cp311-cp311-manylinux_2_17_x86_64", False),
        ("musllinux_1_2_x86_64", "cp311-cp311-linux_x86_64", False),  # a glibc build
    ],
)
def test_each_platform_family_takes_its_own_wheels(platform: str, tag: str, accepted: bool) -> None:
    target = Target(python="3.11", platform=platform)
    assert (Tag(*tag.split("-")) in target.tag_priority) is accepted


@pytest.mark.parametrize(
    ("platform", "family", "os_name", "system", "sys_platform", "machine"),
    [
        ("manylinux_2_28_x86_64", "linux", "posix", "Linux", "linux", "x86_64"),
        ("musllinux_1_2_aarch64", "musllinux", "posix", "Linux", "linux", "aarch64"),
        ("macosx_14_0_arm64", "macos", "posix", "Darwin", "darwin", "arm64"),
        ("macosx_10_9_x86_64", "macos", "posix", "Darwin", "darwin", "x86_64"),
        ("win_amd64", "windows", "nt", "Windows", "win32", "AMD64"),
        ("win_arm64", "windows", "nt", "Windows", "win32", "ARM64"),
    ],
)
def test_the_marker_environment_is_the_target_s_os(
    platform: str, family: str, os_name: str, system: str, sys_platform: str, machine: str
) -> None:
    target = Target(python="3.12", platform=platform)
    env = target.marker_environment
    assert target.family == family
    assert (env["os_name"], env["platform_system"], env["sys_platform"]) == (
        os_name,
        system,
        sys_platform,
    )
    assert env["platform_machine"] == machine
    assert env["python_full_version"] == "3.12.0"


@pytest.mark.parametrize(
    ("platform", "why"),
    [
        ("manylinux_2_28_x86_64", None),
        ("linux_aarch64", None),
        ("win_amd64", "windows target: its suite runs in place on a Windows GPU runner"),
        ("macosx_14_0_arm64", "macos target: it is served from its lock"),
        ("musllinux_1_2_x86_64", "musllinux target: it is served from its lock"),
    ],
)
def test_only_glibc_linux_rows_get_images(platform: str, why: str | None) -> None:
    found = not_in_images(platform)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found and "glibc Linux" in found


def test_an_aarch64_target_takes_aarch64_wheels_only() -> None:
    target = Target(python="3.11", platform="manylinux_2_28_aarch64")
    assert Tag("cp311", "cp311", "manylinux2014_aarch64") in target.tag_priority
    assert Tag("cp311", "cp311", "manylinux2014_x86_64") not in target.tag_priority
    assert target.marker_environment["platform_machine"] == "aarch64"


# -- uv's spelling ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("manylinux_2_28_x86_64", "x86_64-manylinux_2_28"),
        ("manylinux_2_17_x86_64", "x86_64-manylinux_2_17"),
        ("manylinux_2_28_aarch64", "aarch64-manylinux_2_28"),
        ("manylinux2014_x86_64", "x86_64-manylinux_2_17"),
        ("manylinux2010_x86_64", "x86_64-manylinux_2_12"),
        ("manylinux1_x86_64", "x86_64-manylinux_2_5"),
        ("linux_x86_64", "x86_64-unknown-linux-gnu"),
        ("musllinux_1_2_x86_64", "x86_64-unknown-linux-musl"),
        ("macosx_14_0_arm64", "aarch64-apple-darwin"),
        ("macosx_10_9_x86_64", "x86_64-apple-darwin"),
        ("win_amd64", "x86_64-pc-windows-msvc"),
        ("win_arm64", "aarch64-pc-windows-msvc"),
    ],
)
def test_uv_platform(platform: str, expected: str) -> None:
    assert Target(python="3.11", platform=platform).uv_platform == expected


# -- CUDA tags -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "version"), [("cu121", "12.1"), ("cu118", "11.8"), ("cu130", "13.0"), ("cu128", "12.8")]
)
def test_cuda_tags_and_versions_convert_both_ways(tag: str, version: str) -> None:
    assert CudaTag.from_tag(tag).version == version
    assert CudaTag.from_version(version).tag == tag
    assert CudaTag.from_version(version + ".105").tag == tag
    assert CudaTag.parse(tag) == CudaTag.parse(version)


@pytest.mark.parametrize("bad", ["cpu", "12.1", "cu", "cuda121", "default", "CU121"])
def test_a_bad_cuda_tag_is_an_error_quoting_it(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        CudaTag.from_tag(bad)


@pytest.mark.parametrize("bad", ["12", "cu121", "twelve.one", "", "12.10"])
def test_a_bad_cuda_version_is_an_error_quoting_it(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        CudaTag.from_version(bad)


@pytest.mark.parametrize(
    ("spelling", "normalised"),
    [
        ("cu121", "cu121"),
        ("12.1", "cu121"),
        ("13.0", "cu130"),
        ("11.8", "cu118"),
        ("cpu", "cpu"),
        ("default", "default"),
        ("cuda12", None),
        ("12.10", None),
        ("cu", None),
        ("CU121", None),
    ],
)
def test_cuda_spellings(spelling: str, normalised: str | None) -> None:
    assert normalise_cuda(spelling) == normalised


@pytest.mark.parametrize(
    ("torch_cuda", "tag"),
    [("13.0", "cu130"), ("12.1", "cu121"), ("12.8.1", "cu128"), (None, "cpu")],
)
def test_cuda_tag(torch_cuda: str | None, tag: str) -> None:
    assert cuda_tag_of(torch_cuda) == tag
