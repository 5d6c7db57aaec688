"""Starting worker processes: from a fork server that imported torch once, else fresh.

Each worker is a process of its own in a session of its own, whichever way it is
started: the time limit (or a ``stop`` predicate, asked every ``POLL_S``) kills its
process group, a crash ends only it. Where the fork server cannot start or is lost,
every later worker is a freshly started interpreter (``python -m
envbuilder.conformance.worker``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "ForkServer",
    "ForkServerLost",
    "Launcher",
    "Spawner",
    "exit_description",
    "log_tail",
]


#: how often a ``stop`` predicate is asked while a worker runs
POLL_S = 0.25

#: POSIX: each worker leads a process group of its own, and the group is killed (on Windows,
#: which has neither process groups nor fork, the worker process alone)
_GROUPS = hasattr(os, "killpg")

#: asked while a worker runs; True kills it as at the time limit
Stop = Callable[[], bool]


def _wait_slice(deadline: float, stop: Stop | None) -> float:
    """How long to wait before looking again: until ``deadline``, or one poll with ``stop``."""
    left = max(deadline - time.monotonic(), 0.0)
    return left if stop is None else min(left, POLL_S)


def _over(deadline: float, stop: Stop | None) -> bool:
    return time.monotonic() >= deadline or (stop is not None and stop())


def exit_description(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def log_tail(path: Path, limit: int = 600) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-6:])[-limit:]


class Spawner:
    """Starts each worker as a fresh interpreter (``python -m envbuilder.conformance.worker``)."""

    def __init__(self, python: str) -> None:
        self.python = python

    def run(
        self, argv: Sequence[str], output: Path, timeout: float, stop: Stop | None = None
    ) -> int | None:
        """Run a worker in its own session; None when it was killed at the time limit (or
        when ``stop`` said so)."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        command = [self.python, "-m", "envbuilder.conformance.worker", *argv]
        with output.open("ab") as sink:
            proc = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=_GROUPS, env=env
            )
            deadline = time.monotonic() + max(timeout, 1.0)
            while True:
                try:
                    return proc.wait(timeout=_wait_slice(deadline, stop))
                except subprocess.TimeoutExpired:
                    if _over(deadline, stop):
                        break
            with contextlib.suppress(ProcessLookupError):
                if _GROUPS:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            proc.wait()
            return None


class ForkServerLost(RuntimeError):
    """The fork server ended or stopped answering."""


class ForkServer:
    """Workers forked from ``envbuilder.conformance.forkserver``, which imported torch once.

    Each worker is still a process of its own in a session of its own: the time
    limit kills its process group, a crash ends only it. When the server is lost
    the workers in flight are killed and :meth:`run` raises ``ForkServerLost``.
    Requests are written while the server still imports: the first one (the
    runner facts, which need torch only) is answered as soon as torch is in.
    """

    #: how long the server may take to import its preload modules (a cold disk is slow)
    READY_TIMEOUT_S = 300.0

    def __init__(self, python: str, log: Path) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = log.open("ab")
        self._proc = subprocess.Popen(
            [python, "-m", "envbuilder.conformance.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            encoding="utf-8",
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._requests: IO[str] = self._proc.stdin
        self._lock = threading.Lock()  # request ids and writes, one request at a time
        self._changed = threading.Condition()
        self._forked: dict[int, tuple[int, list[str]]] = {}  # request id: (pid, its preload)
        self._next_id = 0
        self._exits: dict[int, int] = {}
        self._lost = False
        self.ready = False  # the server answers requests
        self.report: dict[str, Any] = {}  # what the server preloaded, once it has
        self.forked_with: list[str] = []  # the preload modules the latest child had
        self.warmed: dict[str, Any] = {}  # the server's background work, as each ended
        self.forked_warm: dict[str, int] = {}  # children forked after each had ended
        self._reader = threading.Thread(
            target=self._read, args=(self._proc.stdout,), name="forkserver-reader", daemon=True
        )
        self._reader.start()
        self._log_path = log

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._changed:
                if "ready" in message:
                    self.ready = True
                elif "pid" in message:
                    preloaded = [str(m) for m in message.get("preloaded", [])]
                    self._forked[int(message.get("id") or 0)] = (int(message["pid"]), preloaded)
                    for name in message.get("warmed", []):
                        self.forked_warm[str(name)] = self.forked_warm.get(str(name), 0) + 1
                elif "warmed" in message:
                    self.warmed |= dict(message["warmed"])
                elif "preloaded" in message:
                    self.report = message
                elif "exited" in message:
                    self._exits[int(message["exited"])] = int(message["status"])
                self._changed.notify_all()
        with self._changed:
            self._lost = True
            self._changed.notify_all()

    def run(
        self,
        argv: Sequence[str],
        output: Path,
        timeout: float,
        *,
        after: str | None = None,
        hold: bool = False,
        stop: Stop | None = None,
    ) -> int | None:
        """Run a worker once the preload modules up to ``after`` are imported (all of them
        when None); ``hold``: the server pauses its preloading until the next request;
        ``stop``: asked while it runs, True kills it as at the time limit."""
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            request = {
                "id": rid,
                "argv": list(argv),
                "output": str(output),
                "after": after,
                "hold": hold,
                "resume": not hold,
            }
            try:
                self._requests.write(json.dumps(request) + "\n")
                self._requests.flush()
            except (BrokenPipeError, OSError, ValueError) as e:
                raise ForkServerLost(f"the fork server is gone: {e}") from e
        with self._changed:
            self._changed.wait_for(lambda: rid in self._forked or self._lost, self.READY_TIMEOUT_S)
            if rid not in self._forked:
                if not self.ready:
                    raise ForkServerLost(
                        f"the fork server did not start (see {self._log_path.name}):"
                        f" {log_tail(self._log_path, 300)}"
                    )
                raise ForkServerLost("the fork server did not fork the worker")
            pid, self.forked_with = self._forked.pop(rid)
        deadline = time.monotonic() + max(timeout, 1.0)  # from the fork, not the request
        with self._changed:
            while not self._changed.wait_for(
                lambda: pid in self._exits or self._lost, _wait_slice(deadline, stop)
            ):
                if _over(deadline, stop):
                    break
            if pid in self._exits:
                return self._exits.pop(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._lost, 30)
            self._exits.pop(pid, None)
            if self._lost:
                raise ForkServerLost("the fork server ended while a worker ran")
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._requests.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


class Launcher:
    """Starts worker processes: from the fork server while it lives, else fresh."""

    def __init__(
        self, python: str, workdir: Path, echo: Callable[[str], None], *, fork_server: bool
    ) -> None:
        self._spawner = Spawner(python)
        self._server: ForkServer | None = None  # while forking
        self._used: ForkServer | None = None  # the server workers were forked from, if any
        self._error: str | None = None
        self._echo = echo
        if fork_server and not hasattr(os, "fork"):
            self._error = "this operating system cannot fork"
            echo(f"  ! {self._error}; starting a fresh interpreter per group")
        elif fork_server:
            try:
                self._server = self._used = ForkServer(python, workdir / "forkserver.log")
            except OSError as e:
                self._error = f"the fork server did not start: {e}"[:500]
                echo(f"  ! {self._error}; starting a fresh interpreter per group")

    @property
    def notes(self) -> dict[str, Any]:
        """How the workers were started, for the results' ``runner.launch``."""
        notes: dict[str, Any] = {"fork_server": self._server is not None}
        if self._used is not None:
            # before the preloading ended (or without it): what the last child had
            report = self._used.report or {"preloaded": self._used.forked_with}
            notes |= {
                "preloaded": list(report.get("preloaded", [])),
                "preload_skipped": dict(report.get("skipped", {})),
                "preload_s": report.get("import_s"),
                "preload_module_s": dict(report.get("module_s", {})),
                "threads_at_fork": report.get("threads"),
            }
            if self._used.warmed:
                notes["warmed"] = {
                    name: {**done, "children_after": self._used.forked_warm.get(name, 0)}
                    for name, done in self._used.warmed.items()
                }
        if self._error is not None:
            notes["fork_server_error"] = self._error
        return notes

    def run(
        self,
        argv: Sequence[str],
        output: Path,
        timeout: float,
        *,
        after: str | None = None,
        hold: bool = False,
        stop: Stop | None = None,
    ) -> int | None:
        """Run a worker; forked, it waits for the preload modules up to ``after`` (and with
        ``hold`` the server pauses its preloading until the next request); ``stop`` is asked
        while it runs, and True kills it as at the time limit."""
        server = self._server
        if server is not None:
            start = time.monotonic()
            try:
                return server.run(argv, output, timeout, after=after, hold=hold, stop=stop)
            except ForkServerLost as e:
                self.stop_forking(str(e))
                timeout -= time.monotonic() - start
        return self._spawner.run(argv, output, timeout, stop)

    @property
    def forking(self) -> bool:
        return self._server is not None

    def stop_forking(self, reason: str) -> None:
        """Start every worker fresh from now on."""
        if self._server is not None:
            self._echo(f"  ! {reason}; starting a fresh interpreter per group from now on")
            self._server.close()
            self._server = None
            self._error = reason[:500]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
