"""Where the doctor's light probe finds torch's or xformers' libraries not loading, an
import decides: ``import torch`` loads the CUDA runtimes of the ``nvidia-*`` wheels beside
it before xformers' extension, which the light probe cannot do (on an H200 it found a
``-cudart`` venv's extension not loading that ``import xformers.ops`` then loaded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envbuilder.consumer import _extload
from envbuilder.consumer.doctor import _report_of, start_probe

#: A torch without shared objects that imports: the light probe cannot load it, an import can.
STAND_IN = {
    "torch/__init__.py": "from torch import cuda, version\n__version__ = '9.9.9'\n",
    "torch/version.py": "cuda = None\nhip = None\n__version__ = '9.9.9'\n",
    "torch/cuda/__init__.py": "def is_available():\n    return False\n",
    "torch-9.9.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n",
}


def test_a_light_probe_failure_hands_over_to_an_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in STAND_IN.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    light = _report_of(_extload, sys.executable, 120)
    assert light["light"] is True and light["torch"] is None, light
    report = start_probe(sys.executable, timeout=300).report()
    assert not report.get("light"), report
    assert report.get("torch") == "9.9.9", report
    # an xformers installed beside it cannot import on this torch: a finding, not a crash
    xformers = report.get("xformers")
    assert xformers is None or "error" in xformers, report


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in STAND_IN.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_with_a_gpu_device_the_smoke_test_starts_without_the_light_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The smoke test runs on a GPU host whatever the light probe finds: it starts at once,
    and the report says how long each probe took."""
    _stand_in(tmp_path, monkeypatch)
    monkeypatch.setattr("envbuilder.consumer.doctor.gpu_present", lambda: True)
    report = start_probe(sys.executable, timeout=300).report()
    assert not report.get("light"), report
    assert set(report["probe_seconds"]) == {"full probe"}, report
    assert report["seconds"]["import torch"] >= 0, report
    # --fast starts with the light probe, GPU or not (here an import then decides)
    fast = start_probe(sys.executable, fast=True, timeout=300).report()
    assert list(fast["probe_seconds"]) == ["light probe", "full probe"], fast


def test_without_a_gpu_device_the_light_probe_answers_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in(tmp_path, monkeypatch)
    monkeypatch.setattr("envbuilder.consumer.doctor.gpu_present", lambda: False)
    report = start_probe(sys.executable, timeout=300).report()
    # the stand-in's libraries do not load, so an import decided after the light probe
    assert list(report["probe_seconds"]) == ["light probe", "full probe"], report
