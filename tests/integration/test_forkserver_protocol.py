"""The fork server's protocol, with a real server process and light preload modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _server(tmp_path: Path, preload: str, *, gate: Path | None = None) -> subprocess.Popen[str]:
    """The fork server preloading ``preload``; its ``slow_import`` takes 2 s and, with
    ``gate``, does not finish before that file exists."""
    (tmp_path / "slow_import.py").write_text(
        "import os, time\n"
        "time.sleep(2)\n"
        "gate = os.environ.get('SLOW_IMPORT_GATE')\n"
        "deadline = time.monotonic() + 120\n"
        "while gate and not os.path.exists(gate) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    env = dict(os.environ)
    if gate is not None:
        env["SLOW_IMPORT_GATE"] = str(gate)
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


def _request(
    server: subprocess.Popen[str], output: Path, rid: int, after: str | None, **flags: bool
) -> None:
    assert server.stdin is not None
    # bad worker arguments: the child exits 2 at once, without torch
    request = {"id": rid, "argv": ["--no-such-option"], "output": str(output), "after": after}
    request |= flags
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()


def _read_until(server: subprocess.Popen[str], done: Any) -> list[dict[str, Any]]:
    assert server.stdout is not None
    messages: list[dict[str, Any]] = []
    while not done(messages):
        line = server.stdout.readline()
        assert line, f"the server ended early after {messages}"
        messages.append(json.loads(line))
    return messages


def test_each_request_waits_for_the_preload_modules_up_to_its_own(tmp_path: Path) -> None:
    """A request naming a module is forked once the modules up to it are imported, even
    while an earlier request still waits; one naming no listed module waits for all."""
    gate = tmp_path / "slow_import.go"  # slow_import ends only after the early fork
    server = _server(tmp_path, "json,slow_import,email.message", gate=gate)
    assert _read_until(server, lambda m: m) == [{"ready": True}]  # after json
    _request(server, tmp_path / "all.log", 1, None)
    _request(server, tmp_path / "late.log", 2, "email.message")
    _request(server, tmp_path / "early.log", 3, "json")  # as the runner facts: torch only
    messages = _read_until(server, lambda m: any(x.get("id") == 3 and "pid" in x for x in m))
    gate.touch()
    messages += _read_until(server, lambda m: sum("exited" in x for x in messages + m) == 3)
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(timeout=30) == 0
    order = [m.get("id", "report") for m in messages if "pid" in m or "import_s" in m]
    # the early one went first, before the slow module was through; the rest after it
    assert order[0] == 3 and set(order[1:]) == {1, 2, "report"}
    forked = {m["id"]: m for m in messages if "pid" in m}
    assert forked[3]["preloaded"] == ["json"]
    assert (
        forked[1]["preloaded"] == forked[2]["preloaded"] == ["json", "slow_import", "email.message"]
    )
    exits = {m["exited"]: m["status"] for m in messages if "exited" in m}
    assert exits == {forked[i]["pid"]: 2 for i in (1, 2, 3)}
    assert "--no-such-option" in (tmp_path / "early.log").read_text()
    report = next(m for m in messages if "import_s" in m)
    assert set(report["module_s"]) == {"json", "slow_import", "email.message"}
    assert report["module_s"]["slow_import"] >= 2.0


def test_a_request_for_a_module_after_the_slow_one_waits_for_it(tmp_path: Path) -> None:
    server = _server(tmp_path, "json,slow_import,email.message")
    _request(server, tmp_path / "late.log", 7, "email.message")  # sent before anything is in
    messages = _read_until(server, lambda m: any("pid" in x for x in m))
    assert messages[0] == {"ready": True}
    forked = messages[-1]
    assert forked["id"] == 7 and forked["preloaded"] == ["json", "slow_import", "email.message"]
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(timeout=30) == 0


def test_a_hold_request_pauses_the_preload_until_the_next_request(tmp_path: Path) -> None:
    """The runner facts hold the preloading, so that the group after them (one that runs
    alone) is forked at once instead of after the slow import that would have begun."""
    server = _server(tmp_path, "json,email.message,slow_import")
    assert _read_until(server, lambda m: m) == [{"ready": True}]  # after json
    _request(server, tmp_path / "facts.log", 1, "json", hold=True)
    _read_until(server, lambda m: any(x.get("exited") for x in m))
    time.sleep(1.0)  # without the hold, slow_import would be half through by now
    _request(server, tmp_path / "alone.log", 2, "email.message", resume=True)
    messages = _read_until(server, lambda m: any(x.get("id") == 2 for x in m))
    assert messages[-1]["preloaded"] == ["json", "email.message"]
    report = _read_until(server, lambda m: any("import_s" in x for x in m))[-1]
    assert report["preloaded"] == ["json", "email.message", "slow_import"]
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(timeout=30) == 0
