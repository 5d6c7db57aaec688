"""Take the run-to-run noise out of a shared library that nvcc helped build.

nvcc compiles each ``.cu`` file through temporary files named
``tmpxft_<pid>_<counter>-<n>_<name>.cudafe1.cpp``, with the nvcc process's
id in hex. The host compiler takes that name as the translation unit's, so it
lands in the linked library as a file symbol (``STT_FILE``), in the static
initialiser's name (``_GLOBAL__sub_I_tmpxft_…``) and in any debug information:
two builds of the same inputs differ in these bytes and, since the linker
hashes the whole output, in the GNU build id. Measured on xformers 0.0.35's
``_C.so`` (nvcc 13.0, GCC 13): the names appear in ``.strtab`` only, one per
``.cu`` file; the cubins in ``.nv_fatbin`` carry no temporary name.

`normalise_elf` rewrites, in the sections that are not loaded at run time
(symbol names, debug information, comments), each distinct
``tmpxft_<pid>_<counter>`` to ``tmpxft_<n>_<counter>`` with ``n`` its order
of first appearance (same length: no offset moves), then sets the build id
to the sha256 of the file with the build id zeroed. Loaded sections are left
alone. Anything that is not a 64-bit little-endian ELF file comes back as it was.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

__all__ = ["TEMPORARY_NAME", "ElfSection", "elf_sections", "is_elf", "normalise_elf"]

TEMPORARY_NAME = re.compile(rb"tmpxft_([0-9a-f]{8})_([0-9a-f]{8})")

_SHF_ALLOC = 0x2
_SHF_COMPRESSED = 0x800
_SHT_NOBITS = 8
_SHT_NOTE = 7
_NT_GNU_BUILD_ID = 3


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    flags: int
    offset: int
    size: int


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def elf_sections(data: bytes) -> list[ElfSection] | None:
    """The section headers of a 64-bit little-endian ELF file; None for anything else."""
    if len(data) < 64 or not is_elf(data) or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)  # fmt: skip
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data):
        return None
    raw = []
    for index in range(shnum):
        name, kind, flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + index * shentsize
        )
        if kind != _SHT_NOBITS and offset + size > len(data):
            return None
        raw.append((name, kind, flags, offset, size))
    if shstrndx >= len(raw):
        return None
    names_at = raw[shstrndx][3]

    def name_of(offset: int) -> str:
        start = names_at + offset
        end = data.find(b"\0", start)
        return data[start:end].decode("ascii", "replace") if end >= 0 else ""

    return [ElfSection(name_of(n), kind, flags, off, size) for n, kind, flags, off, size in raw]


def normalise_elf(data: bytes) -> bytes:
    """``data`` with nvcc's temporary names numbered and the build id a hash of the result."""
    sections = elf_sections(data)
    if sections is None:
        return data
    out = bytearray(data)
    numbers: dict[bytes, int] = {}

    def renumber(match: re.Match[bytes]) -> bytes:
        number = numbers.setdefault(match.group(1), len(numbers))
        return b"tmpxft_%08x_%s" % (number, match.group(2))

    for section in sections:
        if section.type == _SHT_NOBITS or section.flags & (_SHF_ALLOC | _SHF_COMPRESSED):
            continue
        end = section.offset + section.size
        body = bytes(out[section.offset : end])
        if TEMPORARY_NAME.search(body):
            out[section.offset : end] = TEMPORARY_NAME.sub(renumber, body)
    ids = [_build_id(out, s) for s in sections if s.type == _SHT_NOTE]
    found = [place for place in ids if place is not None]
    for start, length in found:
        out[start : start + length] = bytes(length)
    digest = hashlib.sha256(out).digest()
    for start, length in found:
        out[start : start + length] = (digest * (1 + length // len(digest)))[:length]
    return bytes(out)


def _build_id(data: bytearray, section: ElfSection) -> tuple[int, int] | None:
    """Where the GNU build id's bytes are in a note section: (offset, length)."""
    at, end = section.offset, section.offset + section.size
    while at + 12 <= end:
        namesz, descsz, kind = struct.unpack_from("<III", data, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if desc_at + descsz > end:
            return None
        if kind == _NT_GNU_BUILD_ID and bytes(data[name_at : name_at + namesz]) == b"GNU\0":
            return desc_at, descsz
        at = desc_at + (descsz + 3) // 4 * 4
    return None
