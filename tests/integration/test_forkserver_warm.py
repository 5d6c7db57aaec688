"""The fork server probes inductor's CPU vector ISA once, in the background, and the
children forked after it find the answer in memory instead of probing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch._inductor.cpu_vec_isa", reason="needs torch with inductor")

ROOT = Path(__file__).resolve().parents[2]
PRELOAD = "torch,torch._dynamo,torch._inductor.compile_fx"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # a fresh machine's
    return env | extra


def _messages(tmp_path: Path, **extra: str) -> list[dict[str, Any]]:
    """The server's messages until it has answered one request sent once preloading is
    through (and, while warming, once the background work has ended)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "envbuilder.conformance.forkserver"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=_env(tmp_path, ENVBUILDER_CONFORMANCE_PRELOAD=PRELOAD, **extra),
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    warming = extra.get("ENVBUILDER_CONFORMANCE_WARM") != "0"
    messages: list[dict[str, Any]] = []
    sent = False
    deadline = threading.Timer(180, server.kill)  # a server that never warms: no hang
    deadline.start()
    try:
        while not any("exited" in m for m in messages):
            line = server.stdout.readline()
            assert line, f"the server ended early after {messages}"
            messages.append(json.loads(line))
            through = any("import_s" in m for m in messages)
            if not sent and through and (not warming or any("warmed" in m for m in messages)):
                request = {"id": 1, "argv": ["--no-such-option"], "output": str(tmp_path / "w.log")}
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
                sent = True
    finally:
        deadline.cancel()
        server.stdin.close()
        server.wait(timeout=60)
    return messages


def test_the_server_reports_the_probed_isa_and_children_forked_after_it_have_it(
    tmp_path: Path,
) -> None:
    messages = _messages(tmp_path)
    warmed = [m["warmed"] for m in messages if "warmed" in m and "pid" not in m]
    assert len(warmed) == 1, messages
    report = warmed[0]["cpu_vec_isa"]
    assert "error" not in report, report
    assert report["seconds"] > 0 and report["isa"] and isinstance(report["probed"], list)
    (answer,) = [m for m in messages if "pid" in m]
    assert answer["warmed"] == ["cpu_vec_isa"]


def test_with_warming_off_nothing_is_probed_in_the_background(tmp_path: Path) -> None:
    messages = _messages(tmp_path, ENVBUILDER_CONFORMANCE_WARM="0")
    assert not any("warmed" in m and "pid" not in m for m in messages)
    (answer,) = [m for m in messages if "pid" in m]
    assert answer["warmed"] == []


CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from envbuilder.conformance._warm import CpuIsa
    from torch._inductor import cpu_vec_isa

    def pick_in_a_child(probing_allowed):
        pid = os.fork()
        if pid == 0:
            signal.alarm(150)  # a child waiting for a lock it inherited: killed, not hung
            if not probing_allowed:
                def refuse(*args, **kwargs):
                    raise AssertionError(f"the child probed again: {args[:1]}")
                subprocess.run = subprocess.check_call = subprocess.Popen = refuse
            try:
                print("child picked", cpu_vec_isa.pick_vec_isa(), flush=True)
            except BaseException as e:
                print("child failed", e, flush=True)
                os._exit(1)
            os._exit(0)
        return pid

    work = CpuIsa()
    work.start()
    time.sleep(float(sys.argv[1]))
    early = pick_in_a_child(True) if sys.argv[2] == "early" else None
    while not work.done():
        time.sleep(0.05)
    print(work.report(), flush=True)
    late = pick_in_a_child(False)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in (early, late) if p]
    sys.exit(max(abs(c) for c in codes))
    """
)


def _run_child(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=_env(tmp_path), capture_output=True,
        text=True, timeout=400, check=False,
    )  # fmt: skip


def test_a_child_forked_after_the_answer_picks_the_isa_without_a_process(tmp_path: Path) -> None:
    done = _run_child(tmp_path, "0", "none")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "child picked" in done.stdout and "'probed_again': []" in done.stdout


def test_a_child_forked_while_the_probes_run_probes_for_itself_and_ends(tmp_path: Path) -> None:
    """The server holds none of the probes' file locks: a child forked meanwhile waits at
    most for the probing process, never for a lock it inherited."""
    done = _run_child(tmp_path, "1.0", "early")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.count("child picked") == 2
