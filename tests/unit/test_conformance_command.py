"""`envbuilder conformance --in-place`: is this environment the selected combination?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envbuilder.consumer.installed import environment_mismatches
from envbuilder.model import Combination
from envbuilder.target import CudaTag

XF = Combination(
    id="py3.12-cu130-torch2.11.0-xformers0.0.35",
    python="3.12",
    cuda=CudaTag(13, 0),
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


class _Daemon:
    """The one call `gpu_request` makes on a Docker client: `info()`."""

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
    from envbuilder.docker.run import gpu_request
    from envbuilder.errors import MissingToolError

    monkeypatch.setattr("shutil.which", lambda name: smi)
    if outcome == "error":
        with pytest.raises(MissingToolError, match="NVIDIA Container Toolkit"):
            gpu_request(_Daemon(runtimes), allow_cpu, {"CUDA_VISIBLE_DEVICES": "0"})
        return
    requests = gpu_request(_Daemon(runtimes), allow_cpu, {"CUDA_VISIBLE_DEVICES": "0"})
    if outcome == "cpu":
        assert requests == []
    else:
        assert [(r["DeviceIDs"], r["Capabilities"]) for r in requests] == [(["0"], [["gpu"]])]


class _Container:
    def __init__(self, status: int) -> None:
        self.status = status
        self.removed = False

    def logs(self, *, stream: bool, follow: bool) -> list[bytes]:
        return [b"suite output\n"]

    def wait(self) -> dict[str, int]:
        return {"StatusCode": self.status}

    def remove(self, *, force: bool) -> None:
        self.removed = True


class _Containers:
    """`containers.run` that "runs the suite" by writing files into the /results volume."""

    def __init__(self, writes: dict[str, str], status: int) -> None:
        self.writes = writes
        self.container = _Container(status)
        self.kwargs: dict[str, Any] = {}

    def run(self, tag: str, **kwargs: Any) -> _Container:
        self.kwargs = kwargs
        (scratch,) = [h for h, v in kwargs["volumes"].items() if v["bind"] == "/results"]
        assert Path(scratch).stat().st_mode & 0o777 == 0o777  # the image's user can write there
        for name, text in self.writes.items():
            (Path(scratch) / name).write_text(text, encoding="utf-8")
        return self.container


class _Client:
    def __init__(self, writes: dict[str, str], status: int) -> None:
        self.containers = _Containers(writes, status)


@pytest.mark.parametrize(
    ("writes", "status", "copied", "after"),
    [
        (
            {"c.json": "{}", "c.json.jsonl": "{'a'}\n"},
            1,
            "c.json",
            {"c.json": "{}", "c.json.jsonl": "{'a'}\n"},
        ),
        (  # died half way: earlier results stay, the finished checks are kept beside them
            {"c.json.jsonl": "{'a'}\n"},
            139,
            "c.failed.jsonl",
            {"c.json": "earlier", "c.json.jsonl": "earlier", "c.failed.jsonl": "{'a'}\n"},
        ),
        ({"c.json.jsonl": ""}, 2, None, {"c.json": "earlier", "c.json.jsonl": "earlier"}),
    ],
)
def test_what_a_container_wrote_is_copied_without_losing_earlier_results(
    tmp_path: Path, writes: dict[str, str], status: int, copied: str | None, after: dict[str, str]
) -> None:
    from envbuilder.docker.run import run_suite_container

    out_dir = tmp_path / "results"
    out_dir.mkdir()
    for name in ("c.json", "c.json.jsonl"):
        (out_dir / name).write_text("earlier", encoding="utf-8")
    client = _Client(writes, status)
    got = run_suite_container(
        client, "tag", ["python"], devices=[], suite_dir=tmp_path, out_dir=out_dir, results="c.json"
    )
    assert got == (status, copied)
    assert {p.name: p.read_text(encoding="utf-8") for p in out_dir.iterdir()} == after
    assert client.containers.container.removed
    assert client.containers.kwargs["network_mode"] == "none"


class _RefusingContainer(_Container):
    """A container the daemon will not remove (a kill it did not see end)."""

    short_id = "c0ffee"

    def remove(self, *, force: bool) -> None:
        from docker.errors import APIError

        raise APIError("500 Server Error: could not kill: tried to kill container, but did not receive an exit event")  # fmt: skip


def test_a_container_the_daemon_will_not_remove_costs_no_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import envbuilder.docker.containers as containers
    from envbuilder.docker.run import run_suite_container

    monkeypatch.setattr(containers, "_REMOVE_PATIENCE_S", 0.0)
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    client = _Client({"c.json": "{}", "c.json.jsonl": "{'a'}\n"}, 0)
    client.containers.container = _RefusingContainer(0)
    got = run_suite_container(
        client, "tag", ["python"], devices=[], suite_dir=tmp_path, out_dir=out_dir, results="c.json"
    )
    assert got == (0, "c.json")
    assert (out_dir / "c.json").read_text(encoding="utf-8") == "{}"
    warning = capsys.readouterr().err
    assert "could not remove the container c0ffee" in warning
    assert "remove it with `docker rm -f c0ffee`" in warning


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\n"
            "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n",
            ("2.11.0+cu130", "13.0"),
        ),
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", ("2.13.0+cpu", None)),
        ('__version__ = "2.5.1"\ncuda = "12.4"\n', ("2.5.1", "12.4")),
    ],
)
def test_torch_here_reads_torch_version_py_without_importing_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple[str, Any]
) -> None:
    import importlib.machinery
    import importlib.util
    import sys

    from envbuilder.consumer import installed

    package = tmp_path / "torch"
    package.mkdir()
    (package / "version.py").write_text(text)
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setitem(sys.modules, "torch", None)  # an import would raise ImportError
    assert installed.torch_here() == expected


def test_torch_here_without_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from envbuilder.consumer import installed
    from envbuilder.errors import MissingToolError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingToolError, match="torch is not importable"):
        installed.torch_here()
