"""One member of a zip archive, found from the end of its central directory.

`zipfile` turns every record of the central directory into an object before
it reads one member: for a torch wheel that is some 12,000 records and about
50 ms of CPU, held under the GIL, for each of the dozens of wheels a resolve
looks into, when only ``METADATA`` or ``xformers/cpp_lib.json`` is wanted.
These functions read the one record and the member it points to, so a
wheel whose ``.dist-info`` comes last (as the wheel spec recommends) is read
from its last few kilobytes.

They handle the plain case only: one disk, no zip64, no bytes before the
archive, stored or deflated, not encrypted, a local header that agrees with
its record and a CRC that matches. Anything else raises `NotHandled`, and
the caller reads the archive with `zipfile`, which reads it or says what is
wrong with it.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "DirectoryBounds",
    "Entry",
    "NotHandled",
    "TooLarge",
    "extract",
    "find_directory",
    "find_entry",
]

# The layouts of the zip specification (APPNOTE.TXT 4.3.7, 4.3.12, 4.3.15, 4.3.16).
END_SIGNATURE, _END_FORMAT = b"PK\x05\x06", "<4s4H2LH"
LOCATOR64_SIGNATURE, LOCATOR64_SIZE = b"PK\x06\x07", 20
RECORD_SIGNATURE, _RECORD_FORMAT = b"PK\x01\x02", "<4s4B4HL2L5H2L"
LOCAL_SIGNATURE, _LOCAL_FORMAT = b"PK\x03\x04", "<4s2B4HL2L2H"
END_SIZE = struct.calcsize(_END_FORMAT)
RECORD_SIZE = struct.calcsize(_RECORD_FORMAT)
LOCAL_SIZE = struct.calcsize(_LOCAL_FORMAT)

_STORED, _DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
#: encrypted (bit 0), compressed patch data (bit 5), strong encryption (bit 6)
_FLAGS_NOT_HANDLED = 0x01 | 0x20 | 0x40
_ZIP64_MARK = 0xFFFFFFFF


class NotHandled(ValueError):
    """A case left to `zipfile` (zip64, encryption, a disagreeing header, ...)."""


class TooLarge(ValueError):
    """A member larger than the reader's bound (said so by its record, or found inflating)."""


@dataclass(frozen=True, kw_only=True)
class DirectoryBounds:
    """Where the central directory lies: bytes ``start`` to ``end`` (exclusive)."""

    start: int
    end: int


@dataclass(frozen=True, kw_only=True)
class Entry:
    """What the central directory says about one member."""

    name: str
    header_offset: int
    compress_type: int
    compress_size: int
    file_size: int
    crc: int
    extra_length: int

    def span(self, slack: int = 0) -> tuple[int, int]:
        """The bytes ``[start, end)`` of its local header and data, if the local extra
        field is no longer than the central one plus ``slack``."""
        start = self.header_offset
        name_length = len(self.name.encode("ascii"))
        length = LOCAL_SIZE + name_length + self.extra_length + slack
        return start, start + length + self.compress_size


def find_directory(tail: bytes, tail_start: int, size: int) -> DirectoryBounds | None:
    """The central directory's bounds, from the archive's last bytes ``tail`` (which
    begin at offset ``tail_start`` of an archive of ``size`` bytes); None when the
    end record is not in ``tail``. Raises `NotHandled` for zip64, several disks or
    bytes before the archive."""
    pos = tail.rfind(END_SIGNATURE)
    if pos < 0:
        return None
    if len(tail) - pos < END_SIZE:
        raise NotHandled("the end record's signature is not followed by a whole record")
    (_, disk, directory_disk, on_disk, total, length, offset, comment) = struct.unpack(
        _END_FORMAT, tail[pos : pos + END_SIZE]
    )
    end = tail_start + pos
    if end + END_SIZE + comment != size:
        raise NotHandled("the end record's comment does not reach the end of the archive")
    if disk or directory_disk or on_disk != total:
        raise NotHandled("an archive on several disks")
    if _ZIP64_MARK in (offset, length) or total == 0xFFFF:
        raise NotHandled("a zip64 archive")
    locator = pos - LOCATOR64_SIZE
    if locator < 0 and tail_start > 0:
        raise NotHandled("the tail does not show whether a zip64 locator precedes the end record")
    if locator >= 0 and tail[locator : locator + 4] == LOCATOR64_SIGNATURE:
        raise NotHandled("a zip64 archive")
    if offset + length != end:
        raise NotHandled(
            "bytes before the archive, or a directory that does not end where it should"
        )
    return DirectoryBounds(start=offset, end=end)


def find_entry(directory: bytes, name: str) -> Entry | None:
    """The last record named ``name`` in ``directory`` (the central directory's bytes, or
    only its last part), the one `zipfile` would pick; None when there is none there."""
    try:
        needle = name.encode("ascii")
    except UnicodeEncodeError as e:
        raise NotHandled(f"a name that is not ASCII: {name!r}") from e
    if needle + b"\0" in directory:
        raise NotHandled(f"a record named {name!r} followed by a NUL, which zipfile cuts off")
    end = len(directory)
    while (found := directory.rfind(needle, 0, end)) >= 0:
        end = found + len(needle) - 1
        start = found - RECORD_SIZE
        if start < 0 or directory[start : start + 4] != RECORD_SIGNATURE:
            continue
        (
            *_,
            flags,
            compress_type,
            _time,
            _date,
            crc,
            compress_size,
            file_size,
            name_length,
            extra_length,
            _comment_length,
            _disk,
            _internal,
            _external,
            header_offset,
        ) = struct.unpack(_RECORD_FORMAT, directory[start:found])
        if name_length != len(needle):
            continue
        if flags & _FLAGS_NOT_HANDLED:
            raise NotHandled(f"{name!r} is encrypted or patch data")
        if compress_type not in (_STORED, _DEFLATED):
            raise NotHandled(f"{name!r} is compressed with method {compress_type}")
        if _ZIP64_MARK in (compress_size, file_size, header_offset):
            raise NotHandled(f"{name!r} has zip64 sizes")
        return Entry(
            name=name,
            header_offset=header_offset,
            compress_type=compress_type,
            compress_size=compress_size,
            file_size=file_size,
            crc=crc,
            extra_length=extra_length,
        )
    return None


def extract(entry: Entry, read: Callable[[int, int], bytes], *, max_size: int) -> bytes:
    """The member's bytes; ``read(start, end)`` gives the archive's bytes ``[start, end)``.
    Raises `TooLarge` for a member of more than ``max_size`` bytes, before reading it
    when its record says so, else as soon as inflating passes the bound."""
    if entry.file_size > max_size or entry.compress_size > max_size + 1024:
        raise TooLarge(f"{entry.name!r} is {entry.file_size} bytes, more than {max_size}")
    header_end = entry.header_offset + LOCAL_SIZE
    header = read(entry.header_offset, header_end)
    if len(header) != LOCAL_SIZE:
        raise NotHandled(f"{entry.name!r}: the local header is cut short")
    (signature, *_, name_length, extra_length) = struct.unpack(_LOCAL_FORMAT, header)
    if signature != LOCAL_SIGNATURE:
        raise NotHandled(f"{entry.name!r}: no local header where the directory says")
    if read(header_end, header_end + name_length) != entry.name.encode("ascii"):
        raise NotHandled(f"{entry.name!r}: the local header names another file")
    start = header_end + name_length + extra_length
    data = read(start, start + entry.compress_size)
    if entry.compress_type == _DEFLATED:
        inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            data = inflate.decompress(data, max_size + 1)
        except zlib.error as e:
            raise NotHandled(f"{entry.name!r}: {e}") from e
        if len(data) > max_size:
            raise TooLarge(f"{entry.name!r} inflates to more than {max_size} bytes")
    if len(data) != entry.file_size or zlib.crc32(data) != entry.crc:
        raise NotHandled(f"{entry.name!r}: the size or CRC-32 does not match the directory")
    return data
