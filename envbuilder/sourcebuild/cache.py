"""Built wheels by build key: ``<root>/<key>/<wheel>`` with its ``build-record.json``.

An entry appears whole (written aside, then renamed into place) and is
trusted only while the wheel's bytes still have the sha256 its record names.
The key and the wheel's file name come from records and lockfiles: they are
checked (`envbuilder.docpath`) before a path is made of them. Puts of one key
may race (two builds, two installs): the last one renamed into place wins, and
neither fails for the other.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuilder.docpath import UnsafeName, checked_name, document_path

__all__ = ["RECORD_NAME", "RECORD_SCHEMA", "BuiltWheel", "BuiltWheelCache", "record_name"]

RECORD_NAME = "build-record.json"


def record_name(combination: str) -> str:
    """A combination's build record file name, in ``locks/`` as in ``results/build-records/``
    (beside the wheel in the cache it is `RECORD_NAME`)."""
    return f"build-record.{combination}.json"


RECORD_SCHEMA = "envbuilder.source-build/1"


@dataclass(frozen=True, kw_only=True)
class BuiltWheel:
    """A cached build: the wheel's path and its build record."""

    path: Path
    record: dict[str, Any]

    @property
    def sha256(self) -> str:
        return str(self.record["wheel"]["sha256"])


class BuiltWheelCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry(self, key: object, *, source: str) -> Path:
        """The directory of build key *key* (from *source*), checked (`UnsafeName`)."""
        return document_path(self.root, ("key", key), source=source)

    def get(self, key: str) -> BuiltWheel | None:
        """The build of ``key``, if the cache holds it intact."""
        entry = self.entry(key, source="the build key")
        try:
            record = json.loads((entry / RECORD_NAME).read_text(encoding="utf-8"))
            wheel = document_path(
                entry, ("wheel", record["wheel"]["filename"]), source=str(entry / RECORD_NAME)
            )
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        except (OSError, ValueError, KeyError, TypeError, UnsafeName):
            return None
        if record.get("key") != key or digest != record["wheel"]["sha256"]:
            return None
        return BuiltWheel(path=wheel, record=record)

    def put(self, key: str, wheel: Path, record: dict[str, Any]) -> BuiltWheel:
        """Store ``wheel`` and its record under ``key`` (replacing what was there)."""
        entry = self.entry(key, source="the build key")
        name = checked_name("wheel", wheel.name, source=f"the wheel {wheel}")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=self.root))
        try:
            shutil.copyfile(wheel, staging / name)
            text = json.dumps(record, indent=2, sort_keys=True) + "\n"
            (staging / RECORD_NAME).write_text(text, encoding="utf-8")
            self._into_place(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for _ in range(100):  # another put of the key may be between its two renames
            built = self.get(key)
            if built is not None:
                return built
            time.sleep(0.01)
        raise OSError(errno.EBUSY, f"{entry} kept being replaced by other writers; try again")

    def _into_place(self, staging: Path, entry: Path) -> None:
        """Rename *staging* to *entry*; what is there is moved aside first and then removed,
        so that a concurrent put of the same key never meets a half-deleted directory."""
        for _ in range(16):
            try:
                staging.rename(entry)
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            aside = self.root / f".{entry.name[:12]}-old-{uuid.uuid4().hex}"
            try:
                entry.rename(aside)
            except FileNotFoundError:
                continue  # another put moved it aside first
            shutil.rmtree(aside, ignore_errors=True)
        raise OSError(errno.EBUSY, f"{entry} kept being replaced by other writers; try again")
