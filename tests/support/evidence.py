"""A fake `Evidence` source: the facts an index would give, with no server."""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message

from packaging.version import Version

from envbuilder.errors import IndexError_
from envbuilder.index.simple import DistributionFile
from envbuilder.model import BuildRecord
from envbuilder.resolve.evidence import file_version
from envbuilder.resolve.sdists import SdistInfo
from envbuilder.resolve.wheels import sdist_version

__all__ = ["DEFAULT", "TAG", "FakeEvidence", "wheel"]

DEFAULT = "http://127.0.0.1:1/simple"
TAG = "cp311-cp311-manylinux_2_28_x86_64"


def wheel(project: str, version: str, tag: str = TAG) -> DistributionFile:
    filename = f"{project}-{version}-{tag}.whl"
    return DistributionFile(
        filename=filename, url=f"{DEFAULT}/files/{filename}", hashes={"sha256": "a" * 64}
    )


@dataclass
class FakeEvidence:
    """What the indexes would say: files per project, Requires-Dist per file, build records."""

    files: dict[str, list[DistributionFile]]
    requires: dict[str, list[str]] = field(default_factory=dict)
    records: dict[str, BuildRecord] = field(default_factory=dict)
    sdists: dict[str, SdistInfo] = field(default_factory=dict)
    broken: bool = False

    def page(self, url: str, project: str, kind: str) -> list[DistributionFile]:
        if self.broken:
            raise IndexError_(f"GET {url!r}: HTTP 503")
        return list(self.files.get(project, []))

    def release_files(
        self, url: str, project: str, kind: str, version: str
    ) -> list[DistributionFile]:
        wanted = Version(version).public
        return [
            f
            for f in self.page(url, project, kind)
            if (v := file_version(f.filename, project) or sdist_version(f.filename, project))
            is not None
            and v.public == wanted
        ]

    def metadata(self, file: DistributionFile) -> Message:
        message = Message()
        for requirement in self.requires.get(file.filename, []):
            message["Requires-Dist"] = requirement
        return message

    def build_record(self, file: DistributionFile) -> BuildRecord | None:
        return self.records.get(file.filename)

    def sdist_info(self, file: DistributionFile) -> SdistInfo:
        return self.sdists[file.filename]
