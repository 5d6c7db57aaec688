"""The Windows in-place suite job that docs/github-actions.md gives passes actionlint, as a
job of a workflow with the inputs and the ``resolve`` job it names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "github-actions.md"
MARKER = "<!-- windows-suite-job:"

#: what the job refers to in gpu-matrix.yml: its dispatch inputs and the resolve job
WORKFLOW = """\
name: windows suite
on:
  workflow_dispatch:
    inputs:
      suite-args:
        type: string
        default: ""
permissions: {}
jobs:
  resolve:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    steps:
      - run: echo resolved
"""


def _snippet() -> str:
    text = DOCS.read_text(encoding="utf-8")
    after = text[text.index(MARKER) :]
    start = after.index("```yaml\n") + len("```yaml\n")
    return after[start : after.index("```\n", start)]


def test_the_documented_windows_job_passes_actionlint(tmp_path: Path) -> None:
    here = str(Path(sys.executable).parent)
    found = shutil.which("actionlint", path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip(
            "actionlint is not installed (pip install --require-hashes -r requirements/actionlint.txt)"
        )
    workflow = tmp_path / ".github" / "workflows" / "windows.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(WORKFLOW + _snippet(), encoding="utf-8")
    # the GPU runners' own label, as a repository declares it to actionlint
    config = tmp_path / ".github" / "actionlint.yaml"
    config.write_text("self-hosted-runner:\n  labels: [gpu]\n", encoding="utf-8")
    linted = subprocess.run(
        [found, "-shellcheck=", "-config-file", str(config), str(workflow)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "runs-on: [self-hosted, windows, x64, gpu]" in _snippet()
