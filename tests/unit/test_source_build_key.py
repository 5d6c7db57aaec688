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


def elf(strtab: bytes, *, rodata: bytes = b"", build_id: bytes = b"\x11" * 20) -> bytes:
    """A minimal 64-bit little-endian ELF file: a build-id note, .rodata, .strtab, .shstrtab."""
    import struct

    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id
    shstrtab = b"\0.note.gnu.build-id\0.rodata\0.strtab\0.shstrtab\0"
    bodies = [note, rodata, strtab, shstrtab]
    # (name offset in shstrtab, type, flags): NOTE+ALLOC, PROGBITS+ALLOC, STRTAB, STRTAB
    headers = [(1, 7, 2), (20, 1, 2), (28, 3, 0), (36, 3, 0)]
    data = bytearray(64)
    offsets = []
    for body in bodies:
        offsets.append(len(data))
        data += body
    shoff = len(data)
    data += bytes(64)  # the null section
    for (name, kind, flags), offset, body in zip(headers, offsets, bodies, strict=True):
        data += struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, offset, len(body), 0, 0, 1, 0)
    data[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHHHHH", data, 0x34, 64, 56, 0, 64, 1 + len(bodies), len(bodies))
    return bytes(data)


def nvcc_strtab(*pids: int) -> bytes:
    """A symbol string table as nvcc's temporary file names leave it: one TU per pid."""
    names = []
    for pid, tu in zip(pids, ("gemm", "pack"), strict=True):
        names.append(b"tmpxft_%08x_00000000-6_%s.cudafe1.cpp" % (pid, tu.encode()))
        names.append(b"_GLOBAL__sub_I_tmpxft_%08x_00000000_6_%s.cudafe1.cpp" % (pid, tu.encode()))
    return b"\0" + b"\0".join(names) + b"\0"


def build_id(data: bytes) -> bytes:
    start = data.index(b"GNU\0") + 4
    return data[start : start + 20]


def test_two_links_that_differ_in_nvcc_temporary_names_give_the_same_library() -> None:
    from envbuilder.sourcebuild.elf import normalise_elf

    one = elf(nvcc_strtab(0x4B9, 0x4BA), build_id=b"\x01" * 20)
    two = elf(nvcc_strtab(0x1F3C, 0x1F3B), build_id=b"\x02" * 20)
    assert one != two
    assert normalise_elf(one) == normalise_elf(two)
    fixed = normalise_elf(one)
    assert b"tmpxft_00000000_00000000-6_gemm.cudafe1.cpp" in fixed
    assert b"_GLOBAL__sub_I_tmpxft_00000001_00000000_6_pack.cudafe1.cpp" in fixed
    assert build_id(fixed) not in (b"\x01" * 20, b"\x00" * 20)
    assert normalise_elf(fixed) == fixed  # a normalised library stays as it is


def test_the_build_id_follows_the_contents_and_loaded_sections_are_left_alone() -> None:
    from envbuilder.sourcebuild.elf import normalise_elf

    loaded = b"tmpxft_000004b9_00000000 in .rodata"
    a = normalise_elf(elf(nvcc_strtab(1, 2), rodata=loaded))
    b = normalise_elf(elf(nvcc_strtab(1, 2), rodata=loaded.replace(b"in", b"at")))
    assert loaded in a  # what the program can read is not rewritten
    assert build_id(a) != build_id(b)


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"\x7fELF\x01\x01" + bytes(100), b"MZ" * 40])
def test_what_is_not_a_64_bit_elf_file_comes_back_as_it_was(data: bytes) -> None:
    from envbuilder.sourcebuild.elf import normalise_elf

    assert normalise_elf(data) == data


def test_a_wheel_s_libraries_are_normalised_inside_it() -> None:
    def with_library(library: bytes) -> bytes:
        entries = [(n, library if n.endswith(".so") else b, s, m) for n, b, s, m in FILES]
        return normalise_wheel(wheel_bytes(entries), source_date_epoch=0)

    assert with_library(elf(nvcc_strtab(10, 11))) == with_library(elf(nvcc_strtab(12, 13)))


def test_compare_names_the_member_and_the_sections_that_differ() -> None:
    from envbuilder.sourcebuild.compare import compare_wheels

    def built(library: bytes) -> bytes:
        entries = [(n, library if n.endswith(".so") else b, s, m) for n, b, s, m in FILES]
        return wheel_bytes(entries)

    one, two = built(elf(nvcc_strtab(1, 2))), built(elf(nvcc_strtab(3, 4)))
    lines = compare_wheels(one, two)
    assert lines[0] == "demo/_ext.so: 673 vs 673 bytes"
    assert lines[1].startswith("  section .strtab: 4 of 207 bytes differ; e.g. ")
    assert len(lines) == 2  # the build id was not changed in this pair
    assert compare_wheels(one, one) == []
