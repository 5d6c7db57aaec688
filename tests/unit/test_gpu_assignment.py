"""One GPU per job: a suite container gets the GPUs its runner was assigned, never all.

The Docker client is faked at its boundary (``info()`` and ``containers.run``): the fake
host resolves each device request the way the NVIDIA runtime does (``device_ids``: those
GPUs; ``count=-1``: every GPU) and the "container" writes the GPUs it sees as its results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.run import RUNNER_LABELS, assigned_gpus, gpu_request, run_suite_container
from envbuilder.errors import InputError

LABELS = RUNNER_LABELS

#: one host, two GPUs, as `nvidia-smi -L` would list them: index -> UUID
HOST_GPUS = {"0": "GPU-0a1b2c3d-0000-4000-8000-000000000000", "1": "GPU-9f8e7d6c-1111-4000-8000-111111111111"}  # fmt: skip


class _Container:
    def logs(self, *, stream: bool, follow: bool) -> list[bytes]:
        return []

    def wait(self) -> dict[str, int]:
        return {"StatusCode": 0}

    def remove(self, *, force: bool) -> None:
        pass


class _Containers:
    def __init__(self, host: _Host) -> None:
        self.host = host

    def run(self, image: str, **kwargs: Any) -> _Container:
        seen = self.host.visible(kwargs["device_requests"])
        (scratch,) = [h for h, v in kwargs["volumes"].items() if v["bind"] == "/results"]
        (Path(scratch) / "r.json").write_text(json.dumps(seen), encoding="utf-8")
        return _Container()


class _Host:
    """A Docker daemon with the NVIDIA runtime on a host with ``HOST_GPUS``."""

    def __init__(self) -> None:
        self.containers = _Containers(self)

    def info(self) -> dict[str, Any]:
        return {"Runtimes": {"nvidia": {}, "runc": {}}}

    def visible(self, requests: list[Any]) -> list[str]:
        seen: list[str] = []
        for request in requests:
            assert ["gpu"] in request["Capabilities"]
            if request["Count"] == -1:
                seen += HOST_GPUS.values()
            for device in request["DeviceIDs"] or []:
                seen.append(HOST_GPUS.get(device, device))
        return seen


def run_job(tmp_path: Path, name: str, environ: dict[str, str]) -> list[str]:
    """One runner's conformance job on the shared host: the GPUs its container saw."""
    host = _Host()
    out = tmp_path / name
    out.mkdir()
    devices = gpu_request(host, False, environ)
    run_suite_container(
        host,
        "image",
        ["python"],
        devices=devices,
        suite_dir=tmp_path,
        out_dir=out,
        results="r.json",
    )
    seen: list[str] = json.loads((out / "r.json").read_text(encoding="utf-8"))
    return seen


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}),
        ({"ENVBUILDER_GPUS": HOST_GPUS["0"], "CUDA_VISIBLE_DEVICES": "1"}, {"ENVBUILDER_GPUS": HOST_GPUS["1"]}),
        ({"NVIDIA_VISIBLE_DEVICES": "0"}, {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "1"}),
        # each runner's labels name its GPU, no variable does
        ({LABELS: "self-hosted,linux,x64,gpu,gpu-index-0"}, {LABELS: "self-hosted,gpu, gpu-index-1"}),
        # the environment wins over a label; "all" names no GPU, so the label counts
        ({"CUDA_VISIBLE_DEVICES": "0", LABELS: "gpu,gpu-index-1"}, {"NVIDIA_VISIBLE_DEVICES": "all", LABELS: "gpu-index-1"}),
    ],
)  # fmt: skip
def test_two_runners_on_one_host_each_see_only_their_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: dict[str, str], second: dict[str, str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    a = run_job(tmp_path, "a", first)
    b = run_job(tmp_path, "b", second)
    assert (a, b) == ([HOST_GPUS["0"]], [HOST_GPUS["1"]])


@pytest.mark.parametrize(
    "environ", [{}, {"NVIDIA_VISIBLE_DEVICES": "all"}, {"CUDA_VISIBLE_DEVICES": ""}]
)
def test_a_job_on_a_gpu_host_that_names_no_gpu_is_refused_not_given_all(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    with pytest.raises(InputError, match=r"never gets every GPU.*CUDA_VISIBLE_DEVICES"):
        run_job(tmp_path, "c", environ)


def test_allow_cpu_runs_without_gpus_where_none_is_assigned() -> None:
    assert gpu_request(_Host(), True, {"CUDA_VISIBLE_DEVICES": ""}) == []


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "0"}, ("0",)),
        ({"CUDA_VISIBLE_DEVICES": " 2, 3 "}, ("2", "3")),
        ({"CUDA_VISIBLE_DEVICES": "none"}, ()),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, ()),
        ({"ENVBUILDER_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, ("1",)),
        ({"ENVBUILDER_GPUS": "all", "CUDA_VISIBLE_DEVICES": "0"}, ("0",)),
        ({"NVIDIA_VISIBLE_DEVICES": "MIG-GPU-0a1b2c3d/1/0"}, ("MIG-GPU-0a1b2c3d/1/0",)),
    ],
)
def test_assigned_gpus_reads_the_first_variable_that_names_some(
    environ: dict[str, str], expected: tuple[str, ...] | None
) -> None:
    assert assigned_gpus(environ) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("0;rm -rf /", "not a GPU index"), ("gpu0", "not a GPU index"), ("0,0", "names a GPU twice")],
)
def test_a_malformed_assignment_is_refused_with_the_variable(value: str, message: str) -> None:
    with pytest.raises(InputError, match=f"CUDA_VISIBLE_DEVICES=.*{message}"):
        assigned_gpus({"CUDA_VISIBLE_DEVICES": value})


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("gpu,gpu-index-0,gpu-index-1", r"labels name 2 GPUs \(gpu-index-0, gpu-index-1\)"),
        ("gpu-index-x", r"'gpu-index-x': 'x' is not a GPU index"),
    ],
)
def test_conflicting_or_malformed_gpu_labels_are_refused(
    tmp_path: Path, labels: str, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        run_job(tmp_path, "d", {LABELS: labels})


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({LABELS: "self-hosted,gpu"}, None),
        ({LABELS: "gpu-index-01,gpu-index-1"}, ("1",)),  # one GPU, named twice
        ({"CUDA_VISIBLE_DEVICES": "", LABELS: "gpu-index-1"}, ()),  # the variable hides all
        ({"ENVBUILDER_GPUS": "2", LABELS: "gpu-index-0,gpu-index-1"}, ("2",)),
    ],
)
def test_a_gpu_label_counts_only_where_no_variable_names_gpus(
    environ: dict[str, str], expected: tuple[str, ...] | None
) -> None:
    assert assigned_gpus(environ) == expected
