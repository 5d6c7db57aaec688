"""Built wheels by build key: ``<root>/<key>/<wheel>`` with its ``build-record.json``.

An entry appears whole (written aside, then renamed into place) and is
trusted only while the wheel's bytes still have the sha256 its record names.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def get(self, key: str) -> BuiltWheel | None:
        """The build of ``key``, if the cache holds it intact."""
        entry = self.root / key
        try:
            record = json.loads((entry / RECORD_NAME).read_text(encoding="utf-8"))
            wheel = entry / record["wheel"]["filename"]
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if record.get("key") != key or digest != record["wheel"]["sha256"]:
            return None
        return BuiltWheel(path=wheel, record=record)

    def put(self, key: str, wheel: Path, record: dict[str, Any]) -> BuiltWheel:
        """Store ``wheel`` and its record under ``key`` (replacing a broken entry)."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=self.root))
        try:
            shutil.copyfile(wheel, staging / wheel.name)
            text = json.dumps(record, indent=2, sort_keys=True) + "\n"
            (staging / RECORD_NAME).write_text(text, encoding="utf-8")
            entry = self.root / key
            if entry.exists():
                shutil.rmtree(entry)
            staging.replace(entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        built = self.get(key)
        assert built is not None
        return built
