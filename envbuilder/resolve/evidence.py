"""The resolver's evidence: index pages, core metadata and build records, fetched once.

`Evidence` is what the decisions read; `IndexEvidence` serves it from the
package indexes over one `HttpClient`, memoised so that combinations that
share pages and files fetch them once, even from several threads at a
time. A fake with the same methods lets the decisions run with no server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Hashable
from email.message import Message
from typing import Any, Protocol, TypeVar

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder import jsondoc
from envbuilder.errors import EnvbuilderError
from envbuilder.index import remotewheel, simple
from envbuilder.index.http import HttpClient
from envbuilder.index.simple import DistributionFile, ProjectPage
from envbuilder.model import BuildRecord, IndexKind
from envbuilder.resolve.sdists import SdistInfo, read_sdist_info
from envbuilder.resolve.wheels import parse_build_record, sdist_version

__all__ = ["BUILD_RECORD", "Evidence", "IndexEvidence", "file_version"]

BUILD_RECORD = "xformers/cpp_lib.json"

_T = TypeVar("_T")


class Evidence(Protocol):
    """What the decisions read about the files on the indexes."""

    def page(self, url: str, project: str, kind: IndexKind) -> list[DistributionFile]:
        """Every file of ``project`` on the index (``kind`` "simple" or "find-links")."""
        ...

    def release_files(
        self, url: str, project: str, kind: IndexKind, version: str
    ) -> list[DistributionFile]:
        """The files of one release (by public version)."""
        ...

    def metadata(self, file: DistributionFile) -> Message:
        """The file's core metadata."""
        ...

    def build_record(self, file: DistributionFile) -> BuildRecord | None:
        """xformers' build record in the file, or None when it has none."""
        ...

    def sdist_info(self, file: DistributionFile) -> SdistInfo:
        """The run-time and build requirements an sdist declares."""
        ...


class _Memo:
    """Compute each key once, even when several threads ask at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            value: _T = self._values[key]
            return value


class IndexEvidence:
    """`Evidence` from the package indexes, each page and file read once per run."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self._memo = _Memo()

    def page(self, url: str, project: str, kind: IndexKind) -> list[DistributionFile]:
        def fetch() -> ProjectPage:
            if kind == "find-links":
                return simple.fetch_find_links(self.client, url, project)
            return simple.fetch_project_page(self.client, url, project)

        page = self._memo.get(("page", url, canonicalize_name(project)), fetch)
        return list(page.files)

    def release_files(
        self, url: str, project: str, kind: IndexKind, version: str
    ) -> list[DistributionFile]:
        def group() -> dict[str, list[DistributionFile]]:
            by_version: dict[str, list[DistributionFile]] = {}
            for file in self.page(url, project, kind):
                found = _file_release(file.filename, project)
                if found is not None:
                    by_version.setdefault(found, []).append(file)
            return by_version

        grouped = self._memo.get(("by-version", url, canonicalize_name(project)), group)
        return list(grouped.get(Version(version).public, []))

    def metadata(self, file: DistributionFile) -> Message:
        key = ("metadata", file.url)
        return self._memo.get(key, lambda: remotewheel.read_core_metadata(self.client, file))

    def build_record(self, file: DistributionFile) -> BuildRecord | None:
        def read() -> BuildRecord | None:
            data = remotewheel.read_member(self.client, file, BUILD_RECORD)
            if data is None:
                return None
            try:
                jsondoc.parse(data)  # bounded: a deeply nested file must not overflow the stack
                return parse_build_record(data)
            except ValueError as e:  # a broken record is this combination's error, not a crash
                raise EnvbuilderError(f"{file.filename!r}: unreadable {BUILD_RECORD}: {e}") from e

        return self._memo.get(("build-record", file.url), read)

    def sdist_info(self, file: DistributionFile) -> SdistInfo:
        return self._memo.get(("sdist", file.url), lambda: _sdist_info(self.client, file))


def _file_release(filename: str, project: str) -> str | None:
    """The public version of a wheel or sdist of ``project``, else None."""
    version = file_version(filename, project)
    if version is None:
        version = sdist_version(filename, project)
    return version.public if version is not None else None


def file_version(filename: str, project: str) -> Version | None:
    """The version of a wheel of ``project`` from its file name, else None."""
    if not filename.endswith(".whl"):
        return None
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return version if name == canonicalize_name(project) else None


def _sdist_info(client: HttpClient, file: DistributionFile) -> SdistInfo:
    """Download the sdist (a few MB), check its sha256, read its requirements.

    What it declares is kept in the cache under the sdist's sha256 (a file on an
    index never changes), so that a re-run or a CI job with the cache restored
    downloads none of it."""
    expected = file.hashes.get("sha256")
    key = f"sdist-info\0sha256:{expected}" if expected else None
    if key is not None and (kept := _kept_sdist_info(client.cache_get(key))) is not None:
        return kept
    info = _downloaded_sdist_info(client, file)
    if key is not None:
        client.cache_put(key, json.dumps(dataclasses.asdict(info), sort_keys=True).encode())
    return info


def _kept_sdist_info(data: bytes | None) -> SdistInfo | None:
    """The `SdistInfo` stored in the cache, or None where there is none fit to use."""
    if data is None:
        return None
    try:
        doc = json.loads(data)
        requires_dist, build_requires = doc["requires_dist"], doc["build_requires"]
        backend = doc["build_backend"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    lists = (requires_dist, build_requires)
    if not all(isinstance(x, list) and all(isinstance(r, str) for r in x) for x in lists):
        return None
    if backend is not None and not isinstance(backend, str):
        return None
    return SdistInfo(
        requires_dist=tuple(requires_dist),
        build_requires=tuple(build_requires),
        build_backend=backend,
    )


def _downloaded_sdist_info(client: HttpClient, file: DistributionFile) -> SdistInfo:
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    for chunk in client.stream(file.url):
        digest.update(chunk)
        chunks.append(chunk)
    expected = file.hashes.get("sha256")
    if expected and digest.hexdigest() != expected:
        raise EnvbuilderError(
            f"{file.filename!r}: sha256 {digest.hexdigest()} does not match the index's {expected}"
        )
    try:
        return read_sdist_info(b"".join(chunks), file.filename)
    except ValueError as e:  # a broken sdist is this combination's error, not a crash
        raise EnvbuilderError(str(e)) from e
