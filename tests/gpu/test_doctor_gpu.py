"""The doctor's GPU checks on a real GPU: run once, then reused while what they depend
on holds, by the full probe and by ``--fast`` alike (skipped without a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envbuilder.consumer import _extload
from envbuilder.consumer.doctor import _report_of, run_probe


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU visible to torch")


def test_compile_checks_run_once_then_come_from_their_record(tmp_path: Path) -> None:
    where = ["--cache", str(tmp_path)]
    first = run_probe(sys.executable, 600, where)
    assert first["cache"]["reused"] is False, first
    assert "from" not in first["compile_sdpa"], first
    assert (tmp_path / "inductor").is_dir()  # torch's caches are the doctor's
    second = run_probe(sys.executable, 600, where)
    assert second["cache"]["reused"] is True, second
    assert second["compile_sdpa"]["status"] == first["compile_sdpa"]["status"]
    assert second["compile_sdpa"]["from"] == second["cache"]["at"]
    assert "from" not in second["attention_sdpa"]  # the eager checks always run
    fast = _report_of(_extload, sys.executable, 120, ["--fast", *where])
    assert fast["cache"]["reused"] is True, fast  # the same key without importing torch
    assert fast["gpu"] == first["gpu"]
    again = run_probe(sys.executable, 600, [*where, "--recheck"])
    assert again["cache"]["reused"] is False and "from" not in again["compile_sdpa"], again
