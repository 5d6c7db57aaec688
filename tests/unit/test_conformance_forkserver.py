"""The fork server's decisions: when CUDA's driver is loaded, which groups run together,
and the order results come out in when groups ran side by side."""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from typing import Any

import pytest

from envbuilder.conformance import GROUPS, forkserver
from envbuilder.conformance._record import CheckResult
from envbuilder.conformance.groups import groups
from envbuilder.conformance.results import order
from envbuilder.conformance.schedule import phases

MAPS_LINE = "7f1c2a000000-7f1c2a100000 r-xp 00000000 fd:01 1234 {}"


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ((), None),
        (("/usr/lib/x86_64-linux-gnu/libc.so.6",), None),
        # the runtime is loaded with torch; only the driver makes a fork unsafe
        (("/site/nvidia/cuda_runtime/lib/libcudart.so.12",), None),
        (
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
        ),
        (("/usr/lib64/libcuda.so.1", "/usr/lib64/libnvidia-ml.so.1"), "/usr/lib64/libcuda.so.1"),
    ],
)
def test_driver_mapped(paths: tuple[str, ...], expected: str | None) -> None:
    maps = "\n".join([MAPS_LINE.format(p) for p in paths] + ["7f00-7f01 rw-p 00000000 00:00 0"])
    assert forkserver.driver_mapped(maps) == expected


def test_a_preload_module_that_loads_the_driver_restarts_the_server_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Modules are imported in order; the one after which libcuda is mapped is skipped
    (with the reason) by starting over in a fresh process image, which is asked to skip
    it; modules that fail to import are skipped and named."""
    loaded: list[str] = []
    for name in ("fs_fake_a", "fs_fake_b", "fs_fake_c"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    def fake_import(name: str) -> Any:
        if name == "fs_fake_missing":
            raise ModuleNotFoundError(f"No module named {name!r}")
        loaded.append(name)
        return sys.modules[name]

    def maps() -> str:
        return MAPS_LINE.format("/usr/lib64/libcuda.so.1") if "fs_fake_b" in loaded else ""

    class Restarted(Exception):
        pass

    def fake_execv(path: str, args: list[str]) -> None:
        raise Restarted(args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    monkeypatch.setattr(forkserver, "_own_maps", maps)
    # the fake driver cannot answer cuCtxGetCurrent: counted as initialised
    monkeypatch.setattr(os, "execv", fake_execv)
    skipped: dict[str, str] = {}
    with pytest.raises(Restarted) as restarted:
        forkserver._preload(["fs_fake_missing", "fs_fake_a", "fs_fake_b", "fs_fake_c"], skipped)
    assert loaded == ["fs_fake_a", "fs_fake_b"]  # c is never imported in the tainted process
    args = restarted.value.args[0]
    assert args[-2] == "--restart"
    assert json.loads(args[-1])["skipped"] == skipped
    assert "libcuda.so.1" in skipped["fs_fake_b"]
    assert "ModuleNotFoundError" in skipped["fs_fake_missing"]

    # the fresh image skips b (and the missing one) and keeps the rest
    loaded.clear()
    monkeypatch.setattr(forkserver, "_own_maps", lambda: "")
    kept = forkserver._preload(["fs_fake_missing", "fs_fake_a", "fs_fake_b", "fs_fake_c"], skipped)
    assert kept == ["fs_fake_a", "fs_fake_c"]


@pytest.mark.parametrize(
    ("jobs", "names", "expected"),
    [
        (1, GROUPS, [[g] for g in GROUPS]),
        (
            4,
            GROUPS,
            [
                ["performance"],
                ["environment", "attention", "compile", "model", "masks", "multigpu"],
            ],
        ),
        (2, ("attention", "performance"), [["performance"], ["attention"]]),
        (4, ("performance",), [["performance"]]),
        (4, ("environment", "model"), [["environment", "model"]]),
    ],
)
def test_phases(jobs: int, names: tuple[str, ...], expected: list[list[str]]) -> None:
    """Side by side, the groups that time kernels still run alone, first: the GPU is
    otherwise idle while the fork server still imports the compiler and diffusers."""
    assert {g.name for g in groups() if g.runs_alone} == {"performance"}
    assert phases(names, jobs) == expected


def _record(name: str) -> dict[str, Any]:
    meta = {"name": name, "gate": True, "impl": "sdpa", "workaround": None}
    return CheckResult.synthetic(meta, "pass", "").to_json()


def test_results_of_groups_run_side_by_side_come_out_in_group_order() -> None:
    stream = [
        _record("model.m1"),
        _record("attention.a1"),
        _record("environment.e1"),
        _record("attention.a2"),
        _record("model.m1"),  # a later record of the same name does not replace the first
        _record("environment.e2"),
    ]
    assert [c.name for c in order(stream)] == [
        "environment.e1",
        "environment.e2",
        "attention.a1",
        "attention.a2",
        "model.m1",
    ]


def test_a_driver_that_is_not_loaded_is_not_initialised() -> None:
    assert forkserver.driver_initialised(MAPS_LINE.format("/usr/lib/libc.so.6")) is None
