"""The build key, the wheel normaliser and the cache of built wheels."""

from __future__ import annotations

import io
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from envbuilder.sourcebuild.cache import BuiltWheelCache
from envbuilder.sourcebuild.key import BuildKey
from envbuilder.sourcebuild.reproducible import normalise_wheel

BASE: dict[str, Any] = {
    "sdist_sha256": "5" * 64,
    "torch": "0" * 64,
    "toolchain": [
        "nvidia-cuda-nvcc==13.0.88 sha256=" + "1" * 64,
        "ninja==1.13.2 sha256=" + "2" * 64,
    ],
    "arch_list": ["8.0", "9.0"],
    "flags": ["TORCH_CUDA_ARCH_LIST=8.0;9.0", "XFORMERS_BUILD_TYPE=Release"],
    "builder": "image:sha256:" + "3" * 64,
    "recipe": "4" * 64,
}


def key(**changes: Any) -> BuildKey:
    return BuildKey.of(**{**BASE, **changes})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sdist_sha256", "6" * 64),
        ("torch", "host:torch==2.11.0 record-sha256=" + "7" * 64),
        ("toolchain", ["nvidia-cuda-nvcc==13.0.88 sha256=" + "8" * 64, BASE["toolchain"][1]]),
        ("toolchain", [*BASE["toolchain"], "host-nvcc:" + "9" * 64]),
        ("arch_list", ["9.0"]),
        ("arch_list", ["8.0", "9.0+PTX"]),
        ("flags", ["TORCH_CUDA_ARCH_LIST=8.0;9.0", "XFORMERS_BUILD_TYPE=RelWithDebInfo"]),
        ("builder", "image:sha256:" + "a" * 64),
        ("recipe", "b" * 64),
    ],
)
def test_every_input_changes_the_key(field: str, value: object) -> None:
    assert key(**{field: value}).digest != key().digest


def test_the_order_of_listed_inputs_does_not_change_the_key() -> None:
    shuffled = key(
        toolchain=list(reversed(BASE["toolchain"])),
        arch_list=["9.0", "8.0", "9.0"],
        flags=list(reversed(BASE["flags"])),
    )
    assert shuffled.digest == key().digest
    assert shuffled.inputs()["arch_list"] == ["8.0", "9.0"]


Stamp = tuple[int, int, int, int, int, int]


def wheel_bytes(entries: list[tuple[str, bytes, Stamp, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, body, stamp, mode in entries:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = mode << 16
            archive.writestr(info, body)
    return out.getvalue()


FILES: list[tuple[str, bytes, Stamp, int]] = [
    ("demo/__init__.py", b"", (2024, 5, 1, 12, 0, 0), 0o100664),
    ("demo/_ext.so", b"\x7fELF...", (2024, 5, 1, 12, 0, 3), 0o100775),
    ("demo-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\n", (2024, 5, 1, 12, 0, 4), 0o100644),
    ("demo-1.0.dist-info/RECORD", b"stale\n", (2024, 5, 1, 12, 0, 4), 0o100644),
]


def test_two_builds_of_the_same_files_give_the_same_wheel_bytes() -> None:
    later = [(n, b, (2025, 1, 2, 3, 4, 6), m & ~0o020) for n, b, _, m in reversed(FILES)]
    one = normalise_wheel(wheel_bytes(FILES), source_date_epoch=0)
    two = normalise_wheel(wheel_bytes(later), source_date_epoch=0)
    assert one == two
    with zipfile.ZipFile(io.BytesIO(one)) as archive:
        names = archive.namelist()
        assert names == [
            "demo/__init__.py",
            "demo/_ext.so",
            "demo-1.0.dist-info/WHEEL",
            "demo-1.0.dist-info/RECORD",
        ]
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
        assert modes["demo/_ext.so"] == 0o100755 and modes["demo/__init__.py"] == 0o100644
        record = archive.read("demo-1.0.dist-info/RECORD").decode()
    assert "demo/_ext.so,sha256=" in record and record.endswith("demo-1.0.dist-info/RECORD,,\n")


def test_different_contents_give_different_bytes() -> None:
    changed = [(n, b + b"!" if n.endswith(".so") else b, s, m) for n, b, s, m in FILES]
    assert normalise_wheel(wheel_bytes(FILES), source_date_epoch=0) != normalise_wheel(
        wheel_bytes(changed), source_date_epoch=0
    )


def test_the_cache_trusts_an_entry_only_while_its_wheel_has_the_recorded_hash(
    tmp_path: Path,
) -> None:
    import hashlib

    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(normalise_wheel(wheel_bytes(FILES), source_date_epoch=0))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    cache = BuiltWheelCache(tmp_path / "cache")
    k = key().digest
    assert cache.get(k) is None
    record = {"key": k, "wheel": {"filename": wheel.name, "sha256": sha}}
    stored = cache.put(k, wheel, record)
    assert stored.sha256 == sha and cache.get(k) == stored
    stored.path.write_bytes(b"tampered")
    assert cache.get(k) is None
    assert cache.get(replace(key(), recipe="c" * 64).digest) is None
