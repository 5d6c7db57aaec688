"""The fork server's protocol, with a real server process and light preload modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _server(tmp_path: Path, preload: str) -> subprocess.Popen[str]:
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(2)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["ENVBUILDER_CONFORMANCE_PRELOAD"] = preload
    return subprocess.Popen(
        [sys.executable, "-m", "envbuilder.conformance.forkserver"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _request(server: subprocess.Popen[str], output: Path, *, early: bool) -> None:
    assert server.stdin is not None
    # bad worker arguments: the child exits 2 at once, without torch
    request = {"argv": ["--no-such-option"], "output": str(output), "early": early}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()


def test_groups_wait_for_the_whole_preload_and_the_runner_facts_do_not(tmp_path: Path) -> None:
    server = _server(tmp_path, "json,slow_import")
    assert server.stdout is not None
    messages: list[dict[str, Any]] = [json.loads(server.stdout.readline())]
    assert messages == [{"ready": True}]  # after json, before the slow module
    _request(server, tmp_path / "group.log", early=False)
    _request(server, tmp_path / "facts.log", early=True)
    while not any("exited" in m for m in messages[1:]) or len(messages) < 6:
        messages.append(json.loads(server.stdout.readline()))
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(timeout=30) == 0
    kinds = [next(iter(m)) for m in messages]
    # requests are answered in order: the group's request holds the early one back
    assert kinds[:3] == ["ready", "preloaded", "pid"]
    pids = [m for m in messages if "pid" in m]
    assert [p["preloaded"] for p in pids] == [["json", "slow_import"]] * 2
    exits = {m["exited"]: m["status"] for m in messages if "exited" in m}
    assert exits == {pids[0]["pid"]: 2, pids[1]["pid"]: 2}
    assert "--no-such-option" in (tmp_path / "group.log").read_text()


def test_the_runner_facts_are_forked_while_the_preload_goes_on(tmp_path: Path) -> None:
    server = _server(tmp_path, "json,slow_import")
    assert server.stdout is not None and server.stdin is not None
    _request(server, tmp_path / "facts.log", early=True)  # as the runner does: at once
    assert json.loads(server.stdout.readline()) == {"ready": True}
    first = json.loads(server.stdout.readline())
    assert first["preloaded"] == ["json"]  # forked before the slow module was imported
    rest = [json.loads(server.stdout.readline()) for _ in range(2)]
    assert {next(iter(m)) for m in rest} == {"exited", "preloaded"}
    server.stdin.close()
    assert server.wait(timeout=30) == 0
