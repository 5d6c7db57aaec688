"""``envbuilder resolve`` against a loopback index that misbehaves: it wants a password,
serves pages that are not index pages, breaks bodies off, hangs.

Each test names the promise it keeps: credentials never written, a broken page
an error (never cached, never replacing an earlier answer), body reads retried,
a failed URL remembered for the run, Ctrl-C honoured at once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_resolver import (  # the resolver's wheels and index layout
    OK,
    PER_CUDA,
    Wheels,
    _server,
    uv,
    wheels,
)

__all__ = ["uv", "wheels"]  # fixtures, used by name

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"
ROWS = """
[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.4.1"
xformers = "0.0.28.post1"

[[combinations]]
python = "3.11"
cuda = "cu121"
torch = "2.5.1"
torch-index = "pytorch"
"""


def _envbuilder(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def _every_file(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("password_ok", [True, False], ids=["right-password", "wrong-password"])
def test_credentials_authenticate_but_are_never_written_or_shown(
    wheels: Wheels, tmp_path: Path, uv: str, password_ok: bool
) -> None:
    """The default index from PIP_INDEX_URL and a matrix index through ${VAR}, both with
    user:password: every output (locks, requirements, resolution.json, --json, --debug
    logs, messages) is searched for the password."""
    given = SECRET if password_ok else SECRET + "-wrong"
    with _server(wheels, basic_auth=("user", SECRET)) as server:
        authed = server.url.replace("http://", f"http://user:{given}@")
        matrix = tmp_path / "matrix.toml"
        matrix.write_text(
            "[indexes.pytorch]\n"
            'url = "'
            + server.url.replace("http://", "http://user:${INDEX_TOKEN}@")
            + '/whl/{cuda}"\n'
            'projects = ["torch"]\n' + ROWS,
            encoding="utf-8",
        )
        env = {
            "PIP_INDEX_URL": authed + "/simple",
            "PIP_CONFIG_FILE": os.devnull,
            "INDEX_TOKEN": given,
        }
        out = tmp_path / "locks"
        argv = ["--debug", "resolve", "--matrix", str(matrix), "--out", str(out), "-vv"]
        proc = _envbuilder(
            *argv, "--cache-dir", str(tmp_path / "cache"), "--json", env=env, cwd=tmp_path
        )
    doc = json.loads(proc.stdout)
    statuses = {c["id"]: c["status"] for c in doc["combinations"]}
    if password_ok:
        assert proc.returncode == 0, proc.stderr
        assert statuses == {OK: "resolved", PER_CUDA: "resolved"}
        assert "user:***@127.0.0.1" in proc.stderr  # the debug logs name the index, starred
    else:
        assert proc.returncode == 1
        assert set(statuses.values()) == {"error"}
        reasons = " ".join(c["reason"] for c in doc["combinations"])
        assert "HTTP 401" in reasons and "user:***@127.0.0.1" in reasons
    written = _every_file(out)
    assert written, "resolve wrote nothing"
    for path, data in written.items():
        assert given.encode() not in data, f"{path} carries the password"
        # messages kept in a file (a reason) may name the user, never the password
        assert not re.search(rb"user:(?!\*\*\*@)", data), f"{path} carries userinfo"
    assert given not in proc.stdout
    assert given not in proc.stderr
