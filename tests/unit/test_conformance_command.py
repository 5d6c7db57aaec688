"""`envbuilder conformance --in-place`: is this environment the selected combination?"""

from __future__ import annotations

import pytest

from envbuilder.commands.conformance import cuda_tag, environment_mismatches
from envbuilder.model import Combination

XF = Combination(
    id="py3.12-cu130-torch2.11.0-xformers0.0.35",
    python="3.12",
    cuda="cu130",
    torch="2.11.0",
    xformers="0.0.35",
)
CPU = Combination(
    id="py3.11-cpu-torch2.13.0", python="3.11", cuda="cpu", torch="2.13.0", xformers=None
)
DEFAULT = Combination(
    id="py3.11-default-torch2.5.1", python="3.11", cuda="default", torch="2.5.1", xformers=None
)


@pytest.mark.parametrize(
    ("combination", "torch_version", "torch_cuda", "xformers", "problem"),
    [
        (XF, "2.11.0+cu130", "13.0", "0.0.35", None),
        (XF, "2.11.0", "13.0", "0.0.35", None),  # public-index build: CUDA from torch.version.cuda
        (XF, "2.11.0+cu128", "12.8", "0.0.35", "built for 'cu128'"),
        (XF, "2.10.0+cu130", "13.0", "0.0.35", "torch is '2.10.0+cu130' here"),
        (XF, "2.11.0+cu130", "13.0", None, "xformers is not installed"),
        (XF, "2.11.0+cu130", "13.0", "0.0.34", "xformers is '0.0.34' here"),
        (XF, None, None, "0.0.35", "torch is not installed"),
        (CPU, "2.13.0+cpu", None, None, None),
        (CPU, "2.13.0", "12.8", None, "built for 'cu128'"),
        (CPU, "2.13.0+cpu", None, "0.0.35", "xformers '0.0.35' is installed"),
        (DEFAULT, "2.5.1", "12.4", None, None),  # 'default' takes whatever CUDA the index had
    ],
)
def test_environment_mismatches(
    combination: Combination,
    torch_version: str | None,
    torch_cuda: str | None,
    xformers: str | None,
    problem: str | None,
) -> None:
    found = environment_mismatches(
        combination, torch_version=torch_version, torch_cuda=torch_cuda, xformers_version=xformers
    )
    if problem is None:
        assert found == []
    else:
        assert any(problem in p for p in found), found


@pytest.mark.parametrize(
    ("torch_cuda", "tag"),
    [("13.0", "cu130"), ("12.1", "cu121"), ("12.8.1", "cu128"), (None, "cpu")],
)
def test_cuda_tag(torch_cuda: str | None, tag: str) -> None:
    assert cuda_tag(torch_cuda) == tag


class _Daemon:
    """The one call `_gpu_request` makes on a Docker client: `info()`."""

    def __init__(self, runtimes: dict[str, object]) -> None:
        self.runtimes = runtimes

    def info(self) -> dict[str, object]:
        return {"Runtimes": self.runtimes}


@pytest.mark.parametrize(
    ("runtimes", "smi", "allow_cpu", "outcome"),
    [
        ({"nvidia": {}, "runc": {}}, None, False, "gpu"),
        ({"runc": {}}, "/usr/bin/nvidia-smi", False, "gpu"),
        ({"runc": {}}, None, True, "cpu"),
        ({"runc": {}}, None, False, "error"),
    ],
)
def test_containers_get_the_gpus_or_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
    runtimes: dict[str, object],
    smi: str | None,
    allow_cpu: bool,
    outcome: str,
) -> None:
    from envbuilder.commands import conformance
    from envbuilder.errors import MissingToolError

    monkeypatch.setattr("shutil.which", lambda name: smi)
    if outcome == "error":
        with pytest.raises(MissingToolError, match="NVIDIA Container Toolkit"):
            conformance._gpu_request(_Daemon(runtimes), allow_cpu)
        return
    requests = conformance._gpu_request(_Daemon(runtimes), allow_cpu)
    if outcome == "cpu":
        assert requests == []
    else:
        assert [(r["Count"], r["Capabilities"]) for r in requests] == [(-1, [["gpu"]])]
