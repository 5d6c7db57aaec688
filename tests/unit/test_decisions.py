"""Decisions against a fake evidence source: no server, just the facts each case needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message

import pytest
from packaging.version import Version

from envbuilder.errors import IndexError_
from envbuilder.index.simple import DistributionFile
from envbuilder.model import BuildRecord, Combination, IndexSpec
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.resolve.evidence import file_version

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
            if (v := file_version(f.filename, project)) is not None and v.public == wanted
        ]

    def metadata(self, file: DistributionFile) -> Message:
        message = Message()
        for requirement in self.requires.get(file.filename, []):
            message["Requires-Dist"] = requirement
        return message

    def build_record(self, file: DistributionFile) -> BuildRecord | None:
        return self.records.get(file.filename)


TORCH = wheel("torch", "2.4.1")
XFORMERS = wheel("xformers", "0.0.28.post1", "cp311-cp311-manylinux_2_28_x86_64")
MATCHING = BuildRecord(torch="2.4.1+cu121", cuda="12.1", arch_list="8.0")


def evidence(
    *,
    torch_cuda: str = "12.1.105",
    xformers_requires: str = "torch==2.4.1",
    record: BuildRecord | None = MATCHING,
    runtimes: tuple[str, ...] = (),
    broken: bool = False,
) -> FakeEvidence:
    return FakeEvidence(
        files={
            "torch": [TORCH],
            "xformers": [XFORMERS],
            "nvidia-cuda-runtime-cu13": [
                wheel("nvidia_cuda_runtime_cu13", v, "py3-none-manylinux_2_28_x86_64")
                for v in runtimes
            ],
        },
        requires={
            TORCH.filename: [f"nvidia-cuda-runtime-cu12=={torch_cuda}", "filelock"],
            XFORMERS.filename: [xformers_requires, "numpy"],
        },
        records={XFORMERS.filename: record} if record else {},
        broken=broken,
    )


def combination(cuda: str = "cu121", *, add_cuda_runtime: bool = False) -> Combination:
    return Combination(
        id=f"py3.11-{cuda}-torch2.4.1-xformers0.0.28.post1",
        python="3.11",
        cuda=cuda,
        torch="2.4.1",
        xformers="0.0.28.post1",
        add_cuda_runtime=add_cuda_runtime,
    )


def run(c: Combination, source: FakeEvidence) -> Decision:
    indexes = {"default": IndexSpec(name="default", url=None)}
    return decide(c, source, indexes=indexes, default_index_url=DEFAULT)


@pytest.mark.parametrize(
    ("c", "source", "status", "says"),
    [
        (combination(), evidence(), "decided", ""),
        (combination("default"), evidence(), "decided", ""),
        (combination("cu124"), evidence(), "unsatisfiable", "no torch 2.4.1 build for cu124: torch-2.4.1-cp311-cp311-manylinux_2_28_x86_64.whl is CUDA 12.1"),
        (combination("cpu"), evidence(), "unsatisfiable", "a CUDA 12.1 build"),
        (combination(), evidence(xformers_requires="torch==2.3.0"), "unsatisfiable", "requires torch==2.3.0 (its Requires-Dist), which torch 2.4.1 does not satisfy"),
        (combination(), evidence(record=BuildRecord(torch="2.4.1", cuda="13.0", arch_list=None)), "unsatisfiable", "needs libcudart.so.13, which this torch does not bring; set add-cuda-runtime = true"),
        (combination(add_cuda_runtime=True), evidence(record=BuildRecord(torch="2.4.1", cuda="13.0", arch_list=None)), "unsatisfiable", "no nvidia-cuda-runtime-cu13 13.0.* on the default index"),
        (combination(), evidence(broken=True), "error", "HTTP 503"),
    ],
)  # fmt: skip
def test_a_decision_and_its_reason(
    c: Combination, source: FakeEvidence, status: str, says: str
) -> None:
    d = run(c, source)
    assert d.status == status
    assert says in d.reason


def test_a_decided_combination_carries_what_the_closure_needs() -> None:
    d = run(combination(), evidence())
    assert d.torch is not None and d.torch.cuda == "12.1" and d.torch.cuda_source == "requires-dist"
    assert d.xformers is not None and d.xformers.requires_torch == "==2.4.1"
    assert d.closure_requirements() == ["nvidia-cuda-runtime-cu12==12.1.105", "filelock", "numpy"]
    assert [p.filename for p in d.pins()] == [TORCH.filename, XFORMERS.filename]
    assert d.indexes[0].url == DEFAULT
    result = d.result("resolved", d.resolved_reason())
    assert result.combination == combination()
    assert "xformers 0.0.28.post1 built with torch 2.4.1+cu121, CUDA 12.1" in result.reason


def test_the_newest_runtime_of_the_build_s_cuda_is_added_when_asked() -> None:
    record = BuildRecord(torch="2.4.1", cuda="13.0", arch_list=None)
    d = run(
        combination(add_cuda_runtime=True),
        evidence(record=record, runtimes=("13.0.48", "13.0.96", "13.1.80")),
    )
    assert d.status == "decided"
    assert d.extra_runtime == ("nvidia-cuda-runtime-cu13==13.0.96",)
    assert any("added nvidia-cuda-runtime-cu13==13.0.96" in n for n in d.notes)


@pytest.mark.parametrize(
    ("record", "note"),
    [
        (None, "has no xformers/cpp_lib.json: its build CUDA is unknown"),
        (BuildRecord(torch="2.4.1", cuda="12.4", arch_list=None), "CUDA minor versions differ"),
        (BuildRecord(torch="2.3.0", cuda="12.1", arch_list=None), "was built against torch 2.3.0"),
    ],
)
def test_what_does_not_stop_a_combination_is_a_note(record: BuildRecord | None, note: str) -> None:
    d = run(combination(), evidence(record=record))
    assert d.status == "decided"
    assert any(note in n for n in d.notes)


def test_a_file_that_does_not_fit_the_target_is_rejected_with_its_reason() -> None:
    source = evidence()
    source.files["torch"].append(wheel("torch", "2.4.1", "cp312-cp312-manylinux_2_28_x86_64"))
    d = run(combination(), source)
    assert d.status == "decided"
    assert [r.filename for r in d.rejected] == ["torch-2.4.1-cp312-cp312-manylinux_2_28_x86_64.whl"]


def test_a_release_missing_from_the_index_names_the_index() -> None:
    source = evidence()
    source.files["torch"] = [wheel("torch", "2.4.0")]
    d = run(combination(), source)
    assert d.status == "unsatisfiable"
    assert d.reason == (
        f"torch 2.4.1 is not on index 'default' ({DEFAULT}); releases there near it: 2.4.0"
    )
