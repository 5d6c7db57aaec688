"""The suite benchmark's bytecode facts: how much of the suite's imports compile sources
(an environment unlike the image), and compiling it as the image does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envbuilder.bench.suite import bytecode, bytecode_line, compile_bytecode


def test_bytecode_counts_source_files_and_compile_bytecode_fills_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment without bytecode is said to compile its sources on each import; the
    image's way of compiling it (unchecked-hash) then leaves none without."""
    site = tmp_path / "site-packages"
    (site / "torch" / "nn").mkdir(parents=True)
    for name in ("torch/__init__.py", "torch/nn/__init__.py", "torch/nn/linear.py"):
        (site / name).write_text("x = 1\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    counts, folders = bytecode(sys.executable)
    assert counts["torch"] == (3, 0)
    assert str(site) in folders
    assert "3 source files without it compile on every import" in bytecode_line(
        {"torch": counts["torch"]}
    )

    compile_bytecode(sys.executable, [str(site)])
    counts, _ = bytecode(sys.executable)
    assert counts["torch"] == (3, 3)
    assert "torch 3 of 3" in bytecode_line({"torch": counts["torch"]})
    pyc = next((site / "torch" / "nn" / "__pycache__").glob("linear.*.pyc")).read_bytes()
    assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, unchecked: as the image
