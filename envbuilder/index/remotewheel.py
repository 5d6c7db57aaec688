"""Read a wheel's METADATA or one member without downloading the wheel.

Order: the PEP 658 ``<url>.metadata`` file when the index advertises it
(checked against its sha256 when given); otherwise, or when that resource is
missing, HTTP range requests into the wheel: the tail first, then the rest of
the central directory only when the member's record is not in the tail, then
the member's local header and data in one request (`_zipentry` reads the one
record). An archive that reader leaves alone is read with ``zipfile``,
fetching only the blocks it asks for. Results are kept in
the client's content-addressed store, keyed by the wheel's sha256 (and the
metadata's own sha256 where the index gives it), so a warm run needs no
network at all.

Nothing is kept or returned before it is checked: a member is at most
``MAX_MEMBER`` bytes (a small wheel cannot inflate into gigabytes), a
``.metadata`` file matches the sha256 the index gives for it, and METADATA
must be UTF-8 core metadata naming the wheel's own project and version (an
HTML login page, or another wheel's metadata from a confused proxy, is an
error naming the URL, never evidence that a release cannot be used).
"""

from __future__ import annotations

import email.message
import email.parser
import email.policy
import hashlib
import io
import logging
import threading
import weakref
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuilder import jsondoc
from envbuilder.errors import IndexError_
from envbuilder.index import _zipentry
from envbuilder.index.http import HttpClient, HttpNotFound
from envbuilder.index.simple import DistributionFile, is_local, local_path

__all__ = [
    "BLOCK_SIZE",
    "BUILD_RECORD",
    "MAX_MEMBER",
    "TAIL_SIZE",
    "RangeFile",
    "check_build_record",
    "check_metadata",
    "metadata_member_name",
    "parse_metadata",
    "read_by_directory",
    "read_core_metadata",
    "read_member",
]

logger = logging.getLogger(__name__)

TAIL_SIZE = 64 * 1024
#: The largest METADATA or member read from a wheel (real METADATA is kilobytes; a long
#: description makes it a few megabytes).
MAX_MEMBER = 16 * 2**20
BLOCK_SIZE = 16 * 1024
#: Wheels whose fetched blocks each client keeps in memory, so that reading METADATA and
#: then a member of the same wheel does not fetch the central directory twice.
_BLOCKS_KEPT_PER_CLIENT = 16
#: Bytes read past a member's data in case its local extra field is longer than the central one.
_LOCAL_EXTRA_SLACK = 512
_ABSENT = b"\x00absent"
_PRESENT = b"\x01"


class RangeFile(io.RawIOBase):
    """A read-only seekable file whose bytes come from ``fetch(start, end)`` on demand.

    Bytes are kept in aligned blocks (in ``blocks``, which several readers of
    the same file may share); adjacent missing blocks are fetched with one
    request.
    """

    def __init__(
        self,
        size: int,
        fetch: Callable[[int, int], bytes],
        *,
        block_size: int = BLOCK_SIZE,
        name: str = "<remote>",
        blocks: dict[int, bytes] | None = None,
    ) -> None:
        super().__init__()
        self._size = size
        self._fetch = fetch
        self._block = block_size
        self._blocks: dict[int, bytes] = {} if blocks is None else blocks
        self._pos = 0
        self.name = name

    def preload(self, start: int, data: bytes) -> None:
        """Keep ``data`` (read elsewhere, e.g. the tail) as bytes from ``start``."""
        end = start + len(data)
        first = -(-start // self._block)  # only whole blocks
        for index in range(first, (end // self._block) + 1):
            lo = index * self._block
            hi = min(lo + self._block, self._size)
            if lo >= start and hi <= end and hi > lo:
                self._blocks[index] = data[lo - start : hi - start]

    @property
    def size(self) -> int:
        return self._size

    def cached_suffix_start(self) -> int:
        """Where the run of bytes already held up to the end of the file begins
        (the file's size when its last block is not held)."""
        last = (self._size - 1) // self._block
        index = last
        while index >= 0 and index in self._blocks:
            index -= 1
        return self._size if index == last else (index + 1) * self._block

    def read_at(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (cut at the end of the file), fetching what is missing
        with one request per run of adjacent missing blocks; the position is unchanged."""
        end = min(end, self._size)
        if start < 0:
            raise ValueError(f"negative offset {start!r}")
        return self._read_span(start, end) if start < end else b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"bad whence {whence!r}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos!r}")
        self._pos = pos
        return pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), max(0, self._size - self._pos))
        if n == 0:
            return 0
        data = self._read_span(self._pos, self._pos + n)
        memoryview(buffer)[:n] = data
        self._pos += n
        return n

    def _read_span(self, start: int, end: int) -> bytes:
        first, last = start // self._block, (end - 1) // self._block
        missing = [i for i in range(first, last + 1) if i not in self._blocks]
        run: list[int] = []
        for index in [*missing, None]:
            if index is not None and (not run or index == run[-1] + 1):
                run.append(index)
                continue
            if run:
                lo = run[0] * self._block
                hi = min((run[-1] + 1) * self._block, self._size)
                data = self._fetch(lo, hi - 1)
                if len(data) != hi - lo:
                    raise IndexError_(
                        f"{self.name}: asked for {hi - lo} bytes at {lo}, got {len(data)}"
                    )
                for i in run:
                    self._blocks[i] = data[
                        (i - run[0]) * self._block : (i - run[0] + 1) * self._block
                    ]
            run = [index] if index is not None else []
        joined = b"".join(self._blocks[i] for i in range(first, last + 1))
        offset = first * self._block
        return joined[start - offset : end - offset]


def metadata_member_name(filename: str) -> str:
    """``<name>-<version>.dist-info/METADATA`` as the wheel's filename spells them."""
    name, version = filename.split("-")[:2]
    return f"{name}-{version}.dist-info/METADATA"


def parse_metadata(data: bytes) -> email.message.Message:
    return email.parser.BytesParser(policy=email.policy.compat32).parsebytes(data)


def _metadata_sha256(file: DistributionFile) -> str | None:
    return file.core_metadata.get("sha256") if isinstance(file.core_metadata, dict) else None


def _cache_key(file: DistributionFile, member: str) -> str:
    identity = f"sha256:{file.sha256}" if file.sha256 else f"url:{file.url}"
    own = _metadata_sha256(file) if member == "METADATA" else None
    if own is not None:  # the bytes' own hash: a new claim by the index is a new key
        identity += f"\0metadata-sha256:{own}"
    return f"wheel-member\0{identity}\0{member}"


def check_metadata(data: bytes, filename: str, source: str) -> email.message.Message:
    """``data`` read as the core metadata of the wheel ``filename``, or `IndexError_`
    naming ``source`` when it is not that: not UTF-8, an HTML page, no Metadata-Version,
    or the Name and Version of another release."""
    head = data.lstrip()[:64].lower()
    if head.startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        raise IndexError_(
            f"{source}: an HTML page instead of core metadata (a login or captive portal "
            "page?); not reading it as the wheel's METADATA"
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IndexError_(
            f"{source}: METADATA is not UTF-8 (byte {e.start}: {data[e.start : e.start + 1]!r}); "
            "core metadata must be UTF-8"
        ) from e
    message = parse_metadata(data)
    problems = [f"no {h}" for h in ("Metadata-Version", "Name", "Version") if not message.get(h)]
    if not problems:
        name, version = filename.split("-")[:2]
        if canonicalize_name(str(message["Name"])) != canonicalize_name(name):
            problems.append(f"Name {str(message['Name'])!r} is not the wheel's {name!r}")
        try:
            if Version(str(message["Version"])) != Version(version):
                problems.append(
                    f"Version {str(message['Version'])!r} is not the wheel's {version!r}"
                )
        except InvalidVersion:
            problems.append(f"Version {str(message['Version'])!r} is not a version")
    if problems:
        raise IndexError_(f"{source}: not the core metadata of {filename!r}: {'; '.join(problems)}")
    for line in message.get_all("Requires-Dist") or ():
        try:
            Requirement(str(line))
        except InvalidRequirement as e:
            raise IndexError_(
                f"{source}: Requires-Dist {str(line)!r} of {filename!r} is not a requirement"
                f" ({e}); refusing the wheel rather than dropping one of its requirements"
            ) from e
    return message


#: xformers' build record, and the type each field it is read for must have where present
BUILD_RECORD = "xformers/cpp_lib.json"
_BUILD_RECORD_FIELDS: tuple[tuple[str, str, tuple[type, ...], str], ...] = (
    ("version", "torch", (str,), "a string"),
    ("version", "cuda", (int, str), "an integer (1201) or a string (12.1)"),
    ("env", "TORCH_CUDA_ARCH_LIST", (str,), "a string"),
)


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def check_build_record(data: bytes, filename: str) -> None:
    """`IndexError_` saying how ``data`` is a malformed ``xformers/cpp_lib.json``: not a JSON
    object, or a field the resolver reads (``version.torch``, ``version.cuda``,
    ``env.TORCH_CUDA_ARCH_LIST``) of another type. A missing field or ``null`` is no record of
    it; a wrong type is a broken record, never read as "unknown"."""
    try:
        doc = jsondoc.parse(data)
    except jsondoc.NotJSON as e:
        raise IndexError_(f"{filename!r}: malformed {BUILD_RECORD}: {e}") from e
    if not isinstance(doc, dict):
        raise IndexError_(
            f"{filename!r}: malformed {BUILD_RECORD}: the document is {_kind(doc)}, not an object"
        )
    for section in ("version", "env"):
        if doc.get(section) is not None and not isinstance(doc[section], dict):
            raise IndexError_(
                f"{filename!r}: malformed {BUILD_RECORD}: {section!r} is"
                f" {_kind(doc[section])}, not an object"
            )
    for section, key, types, expected in _BUILD_RECORD_FIELDS:
        value = (doc.get(section) or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise IndexError_(
                f"{filename!r}: malformed {BUILD_RECORD}: '{section}.{key}' is {_kind(value)}"
                f" ({value!r:.40}), not {expected}"
            )


def _metadata_in(names: list[str], filename: str) -> str | None:
    expected = metadata_member_name(filename)
    if expected in names:
        return expected
    lowered = {n.lower(): n for n in names}
    if expected.lower() in lowered:
        return lowered[expected.lower()]
    candidates = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    return candidates[0] if len(candidates) == 1 else None


def _from_zip(archive: zipfile.ZipFile, filename: str, member: str | None) -> bytes | None:
    names = archive.namelist()
    target = _metadata_in(names, filename) if member is None else member
    if target is None or target not in names:
        return None
    info = archive.getinfo(target)
    if info.file_size > MAX_MEMBER:
        raise _zipentry.TooLarge(f"{target!r} is {info.file_size} bytes, more than {MAX_MEMBER}")
    with archive.open(info) as opened:
        data = opened.read(MAX_MEMBER + 1)
    if len(data) > MAX_MEMBER:
        raise _zipentry.TooLarge(f"{target!r} inflates to more than {MAX_MEMBER} bytes")
    return data


#: What a broken archive raises from `zipfile` besides `BadZipFile`.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError)


class _WheelBlocks:
    """Per client: the size and fetched blocks of the last few wheels read by ranges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_client: weakref.WeakKeyDictionary[
            HttpClient, OrderedDict[str, tuple[int, dict[int, bytes]]]
        ] = weakref.WeakKeyDictionary()

    def get(self, client: HttpClient, url: str) -> tuple[int, dict[int, bytes]] | None:
        with self._lock:
            kept = self._by_client.get(client)
            if kept is None or url not in kept:
                return None
            kept.move_to_end(url)
            return kept[url]

    def put(self, client: HttpClient, url: str, size: int, blocks: dict[int, bytes]) -> None:
        with self._lock:
            kept = self._by_client.setdefault(client, OrderedDict())
            kept[url] = (size, blocks)
            while len(kept) > _BLOCKS_KEPT_PER_CLIENT:
                kept.popitem(last=False)


_WHEEL_BLOCKS = _WheelBlocks()


def _open_remote(client: HttpClient, file: DistributionFile) -> RangeFile:
    def fetch(start: int, end: int) -> bytes:
        return client.get_range(file.url, start, end)

    known = _WHEEL_BLOCKS.get(client, file.url)
    if known is not None:
        size, blocks = known
        return RangeFile(size, fetch, name=file.url, blocks=blocks)
    tail, size = client.get_tail(file.url, TAIL_SIZE)
    if file.size is not None and size != file.size:
        raise IndexError_(
            f"{file.url!r}: the server has {size} bytes where the index lists {file.size} "
            "(another file behind the same URL?)"
        )
    blocks = {}
    remote = RangeFile(size, fetch, name=file.url, blocks=blocks)
    remote.preload(size - len(tail), tail)
    _WHEEL_BLOCKS.put(client, file.url, size, blocks)
    return remote


def read_by_directory(remote: RangeFile, name: str) -> bytes | None:
    """The member ``name`` read from its one record in the central directory: searched
    first in the part the tail request brought, then in the whole directory (one
    more request), then its local header and data (one request); None when the
    directory has no record of that name. Raises `_zipentry.NotHandled` for
    archives this leaves to `zipfile`."""
    size = remote.size
    tail_start = remote.cached_suffix_start()
    bounds = _zipentry.find_directory(remote.read_at(tail_start, size), tail_start, size)
    if bounds is None:
        raise _zipentry.NotHandled("no end-of-central-directory record in the tail")
    near_end = max(bounds.start, tail_start)
    entry = _zipentry.find_entry(remote.read_at(near_end, bounds.end), name)
    if entry is None and near_end > bounds.start:
        entry = _zipentry.find_entry(remote.read_at(bounds.start, bounds.end), name)
    if entry is None:
        return None
    if entry.file_size <= MAX_MEMBER:
        remote.read_at(*entry.span(slack=_LOCAL_EXTRA_SLACK))  # header and data in one request
    return _zipentry.extract(entry, remote.read_at, max_size=MAX_MEMBER)


def _read_by_ranges(client: HttpClient, file: DistributionFile, member: str | None) -> bytes | None:
    remote = _open_remote(client, file)
    wanted = metadata_member_name(file.filename) if member is None else member
    try:
        data = read_by_directory(remote, wanted)
    except _zipentry.NotHandled as e:
        logger.debug("%s: %s; reading its central directory with zipfile", file.url, e)
    else:
        if data is not None or member is not None:
            return data
        # No METADATA under its expected name: zipfile's listing finds it by other spellings.
    try:
        with zipfile.ZipFile(remote) as archive:
            return _from_zip(archive, file.filename, member)
    except _ZIP_ERRORS as e:
        raise IndexError_(f"{file.url!r} is not a valid wheel (zip): {e}") from e


def _read_local(file: DistributionFile, member: str | None) -> bytes | None:
    path = local_path(file.url)
    try:
        with zipfile.ZipFile(path) as archive:
            return _from_zip(archive, file.filename, member)
    except FileNotFoundError as e:
        raise IndexError_(f"wheel {str(path)!r} does not exist") from e
    except _ZIP_ERRORS as e:
        raise IndexError_(f"{str(path)!r} is not a valid wheel (zip): {e}") from e


def _read_pep658(client: HttpClient, file: DistributionFile) -> bytes | None:
    url = file.url + ".metadata"
    try:
        data = client.get(url, max_bytes=MAX_MEMBER, immutable=True).content
    except HttpNotFound:
        logger.debug("%s advertised but missing (404); reading the wheel by ranges", url)
        return None
    expected = _metadata_sha256(file)
    try:
        if expected is not None and hashlib.sha256(data).hexdigest() != expected.lower():
            raise IndexError_(
                f"{url!r}: sha256 {hashlib.sha256(data).hexdigest()!r} does not match the "
                f"index's {expected!r}; the index or a proxy is serving a wrong file"
            )
        check_metadata(data, file.filename, repr(url))
    except IndexError_:
        client.forget(url)  # the next run asks again
        raise
    return data


def _read(client: HttpClient, file: DistributionFile, member: str | None) -> bytes | None:
    if not file.is_wheel:
        raise IndexError_(f"{file.filename!r} is not a wheel; only wheels can be read remotely")
    try:
        if is_local(file.url):
            return _checked(_read_local(file, member), file, member)
        key = _cache_key(file, member or "METADATA")
        cached = client.cache_get(key)
        if cached is not None:
            return None if cached == _ABSENT else cached[len(_PRESENT) :]
        data: bytes | None = None
        if member is None and file.core_metadata:
            data = _read_pep658(client, file)
        if data is None:
            data = _checked(_read_by_ranges(client, file, member), file, member)
    except _zipentry.TooLarge as e:
        raise IndexError_(
            f"{file.url!r}: {e}; refusing it (a decompression bomb or a broken wheel?)"
        ) from e
    client.cache_put(key, _ABSENT if data is None else _PRESENT + data)
    return data


def _checked(data: bytes | None, file: DistributionFile, member: str | None) -> bytes | None:
    if data is not None and member is None:
        check_metadata(data, file.filename, f"{file.url!r} (METADATA)")
    return data


def read_core_metadata(client: HttpClient, file: DistributionFile) -> email.message.Message:
    """The wheel's ``METADATA`` as an email message (``msg.get_all("Requires-Dist")``)."""
    data = _read(client, file, None)
    if data is None:
        raise IndexError_(f"{file.filename!r} ({file.url!r}) has no .dist-info/METADATA")
    return check_metadata(data, file.filename, repr(file.url))


def read_member(client: HttpClient, file: DistributionFile, member_name: str) -> bytes | None:
    """One member of the wheel (e.g. ``xformers/cpp_lib.json``, checked by
    `check_build_record`), or None if it has none."""
    data = _read(client, file, member_name)
    if data is not None and member_name == BUILD_RECORD:
        check_build_record(data, file.filename)
    return data
