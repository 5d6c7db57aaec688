"""Windows, macOS and musllinux rows beside a Linux one, resolved against the real index.

The default index comes from pip's configuration. One CLI run answers every row; each
resolved lock is then checked, with its files' real METADATA, to be the closed
dependency set of its own platform, markers evaluated for that platform.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from envbuilder import cli
from envbuilder.errors import MissingToolError
from envbuilder.index import remotewheel
from envbuilder.index.http import HttpClient
from envbuilder.index.simple import DistributionFile
from envbuilder.pylock import read_lock, select
from envbuilder.resolve.closure import find_uv
from envbuilder.target import Target
from tests.support.closure_check import closure_problems

ROWS = {
    "py3.12-cpu-win_amd64-torch2.8.0": ("win_amd64", "cpu", None),
    "py3.12-default-win_amd64-torch2.8.0-xformers0.0.32.post2": (
        "win_amd64",
        "default",
        "0.0.32.post2",
    ),
    "py3.12-cpu-macosx_14_0_arm64-torch2.8.0": ("macosx_14_0_arm64", "cpu", None),
    "py3.12-cpu-macosx_14_0_arm64-torch2.8.0-xformers0.0.32.post2": (
        "macosx_14_0_arm64",
        "cpu",
        "0.0.32.post2",
    ),
    "py3.12-cpu-musllinux_1_2_x86_64-torch2.8.0": ("musllinux_1_2_x86_64", "cpu", None),
    "py3.12-default-manylinux_2_28_x86_64-torch2.8.0-xformers0.0.32.post2": (
        "manylinux_2_28_x86_64",
        "default",
        "0.0.32.post2",
    ),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    try:
        find_uv()
    except MissingToolError as e:
        pytest.skip(f"uv is needed for closures: {e}")
    tmp = tmp_path_factory.mktemp("resolve-platforms")
    matrix = tmp / "matrix.toml"
    matrix.write_text(
        "".join(
            f'[[combinations]]\npython = "3.12"\ncuda = "{cuda}"\ntorch = "2.8.0"\n'
            f'platform = "{platform}"\n' + (f'xformers = "{xformers}"\n' if xformers else "")
            for platform, cuda, xformers in ROWS.values()
        ),
        encoding="utf-8",
    )
    out = tmp / "locks"
    argv = ["resolve", "--matrix", str(matrix), "--out", str(out)]
    argv += ["--cache-dir", str(tmp / "cache"), "--json"]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli.main(argv)
    doc = json.loads(buffer.getvalue())
    return {c["combination"]["id"]: c for c in doc["combinations"]}, out


def test_every_row_gets_its_answer(run: tuple[dict[str, Any], Path]) -> None:
    answers = run[0]
    assert list(answers) == list(ROWS)
    status = {cid: a["status"] for cid, a in answers.items()}
    assert status == {
        "py3.12-cpu-win_amd64-torch2.8.0": "resolved",
        # the public index's Windows torch is a CPU build; xformers' Windows wheel is CUDA 12.8
        "py3.12-default-win_amd64-torch2.8.0-xformers0.0.32.post2": "unsatisfiable",
        "py3.12-cpu-macosx_14_0_arm64-torch2.8.0": "resolved",
        "py3.12-cpu-macosx_14_0_arm64-torch2.8.0-xformers0.0.32.post2": "unsatisfiable",
        "py3.12-cpu-musllinux_1_2_x86_64-torch2.8.0": "unsatisfiable",
        "py3.12-default-manylinux_2_28_x86_64-torch2.8.0-xformers0.0.32.post2": "resolved",
    }
    windows = answers["py3.12-default-win_amd64-torch2.8.0-xformers0.0.32.post2"]["reason"]
    assert "is a CUDA 12.8 build" in windows and "is a CPU build" in windows


@pytest.mark.parametrize(
    "cid",
    [
        "py3.12-cpu-win_amd64-torch2.8.0",
        "py3.12-cpu-macosx_14_0_arm64-torch2.8.0",
        "py3.12-default-manylinux_2_28_x86_64-torch2.8.0-xformers0.0.32.post2",
    ],
)
def test_a_resolved_lock_is_the_closure_of_its_platform(
    run: tuple[dict[str, Any], Path], cid: str
) -> None:
    answers, out = run
    target = Target(python="3.12", platform=ROWS[cid][0])
    text = (out.parent / answers[cid]["lock"]).read_text(encoding="utf-8")
    packages = select(read_lock(text, source=cid), target, source=cid)
    metadata: dict[str, bytes] = {}
    with HttpClient() as client:
        for p in packages:
            archive = p.archive
            assert archive is not None and archive.url is not None
            file = DistributionFile(
                filename=archive.filename,
                url=archive.url,
                hashes={"sha256": archive.sha256 or ""},
                core_metadata=True,
            )
            requires = remotewheel.read_core_metadata(client, file).get_all("Requires-Dist")
            # one line each, as METADATA has them (the email module would fold long ones)
            lines = [f"Requires-Dist: {r}\n" for r in requires or []]
            metadata[archive.filename] = "".join(lines).encode()
    roots = ["torch", *(["xformers"] if "xformers" in cid else [])]
    assert closure_problems(packages, target, metadata, roots=roots) == []
    names = {p.name for p in packages}
    linux = target.family == "linux"
    assert ("nvidia-cuda-runtime-cu12" in names) is linux
    assert ("triton" in names) is linux
