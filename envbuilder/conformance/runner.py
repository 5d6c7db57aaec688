"""Runs the check groups, each in its own process with a time limit, and writes the results.

The runner never imports torch: a group that segfaults, raises a CUDA error or
hangs is killed and recorded (``error``/``timeout`` on the check it was in,
from the worker's state file) and the remaining groups still run. Every result
is in ``<out>.jsonl`` the moment it finishes; ``<out>`` is written atomically
at the end.

Group processes are forked from a fork server (``forkserver.py``) that has
imported torch once, so each group does not pay the import again; where the
server cannot start, each group is a freshly started interpreter. On a GPU the
groups run side by side (``jobs``), except ``performance``, which times
kernels and so runs alone after the others.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import difflib
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envbuilder.conformance import FULL_ONLY_GROUPS, GROUPS, RESULTS_SCHEMA, SUITE_VERSION
from envbuilder.conformance._record import (
    STATUSES,
    CheckResult,
    Status,
    append_jsonl,
    matches,
    read_jsonl,
)
from envbuilder.conformance.worker import GROUP_MODULES  # imports no torch

__all__ = [
    "DEFAULT_TIMEOUTS",
    "GPU_JOBS",
    "GPU_SHARDS",
    "QUICK_TIMEOUTS",
    "SOLO_GROUPS",
    "GroupRun",
    "NoChecksSelected",
    "NoCudaDevice",
    "RunOptions",
    "SuiteResults",
    "groups_for",
    "pattern_problems",
    "run_suite",
    "settle",
    "summarize",
    "unmatched_patterns",
    "write_atomic",
]

#: seconds each group may take (full run, --quick run); the budget is 10 and 2 minutes on an H200.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "environment": 180,
    "attention": 300,
    "compile": 600,
    "performance": 300,
    "model": 300,
    "masks": 180,
    "multigpu": 300,
}
QUICK_TIMEOUTS: Mapping[str, float] = {
    "environment": 120,
    "attention": 120,
    "compile": 300,
    "performance": 120,
    "model": 180,
    "masks": 120,
    "multigpu": 180,
}

#: groups that run alone, after the others: their checks time kernels.
SOLO_GROUPS: frozenset[str] = frozenset({"performance"})

#: worker processes run side by side on a GPU when ``jobs`` is not given (one at a time on
#: the CPU, where they would only compete for the same cores).
GPU_JOBS = 8

#: groups split across several processes when they run side by side on a GPU: on a freshly
#: started machine the first use of many kernels waits for the driver to compile them (the
#: SDPA checks' kernels are generated at run time), and one process pays for them in turn.
GPU_SHARDS: Mapping[str, int] = {"attention": 4, "compile": 2}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    out: Path
    checks: tuple[str, ...] = ()
    device: str | None = None
    quick: bool = False
    combination: str | None = None
    lock_sha256: str | None = None
    timeouts: Mapping[str, float] = field(default_factory=dict)
    python: str = sys.executable
    #: groups run at once (None: GPU_JOBS on a GPU, else 1)
    jobs: int | None = None
    #: fork group processes from a server that imported torch once
    fork_server: bool = True
    #: processes a group is split across (None: GPU_SHARDS when groups run side by side on
    #: a GPU, else one each)
    parts: Mapping[str, int] | None = None
    #: stop before any check (raising NoCudaDevice) when no CUDA device is visible
    require_cuda: bool = False

    @property
    def jsonl(self) -> Path:
        return self.out.with_name(self.out.name + ".jsonl")

    def timeout_for(self, group: str) -> float:
        if group in self.timeouts:
            return self.timeouts[group]
        return (QUICK_TIMEOUTS if self.quick else DEFAULT_TIMEOUTS)[group]


@dataclass(frozen=True, kw_only=True)
class GroupRun:
    """What the runner learnt from one worker process of a group."""

    plan: tuple[Mapping[str, Any], ...] | None  # None: the worker died before planning
    started: tuple[str, ...]
    #: the descriptions of started checks that are not in the plan (workaround checks)
    unplanned: Mapping[str, Mapping[str, Any]]
    done: frozenset[str]
    exit_status: int | None  # None: killed at the time limit
    log_tail: str


def _plain_group(pattern: str) -> str | None:
    """The group a pattern names plainly (its first dotted part), or None when that is a glob."""
    head = pattern.split(".", 1)[0]
    return None if any(c in head for c in "*?[") else head


def groups_for(patterns: Sequence[str]) -> tuple[str, ...]:
    """The groups a run must start: all, unless every pattern names its group plainly."""
    chosen = [p for p in patterns if p]
    if not chosen:
        return GROUPS
    wanted: set[str] = set()
    for pattern in chosen:
        head = _plain_group(pattern)
        if head is None:
            return GROUPS
        wanted.add(head)
    return tuple(g for g in GROUPS if g in wanted)


class NoCudaDevice(RuntimeError):
    """The run needs a CUDA device and the runner facts found none: nothing is written."""


class NoChecksSelected(ValueError):
    """``--checks`` patterns selected no check: nothing is written."""


def pattern_problems(patterns: Sequence[str]) -> list[str]:
    """What is wrong with ``--checks`` patterns that can be told before any check runs:
    a plain (non-glob) first part that names no group."""
    problems: list[str] = []
    for pattern in patterns:
        head = _plain_group(pattern)
        if not pattern.strip():
            problems.append("--checks '': give a check name, a dotted prefix or a glob")
        elif head is not None and head not in GROUPS:
            near = difflib.get_close_matches(head, GROUPS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(
                f"--checks {pattern!r}: no check group {head!r}{hint};"
                f" the groups are {', '.join(GROUPS)}"
            )
    return problems


def unmatched_patterns(patterns: Sequence[str], results: SuiteResults) -> list[str]:
    """The patterns that selected none of the checks in ``results``."""
    names = [c.name for c in results.checks]
    return [p for p in patterns if p and not any(matches(n, [p]) for n in names)]


def _exit_description(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def settle(
    group: str, run: GroupRun, *, limit_s: float, elapsed_s: float, part: str = ""
) -> tuple[list[CheckResult], bool]:
    """Results for what a dead or killed worker could not report, and whether to restart it.

    A worker killed at the time limit: the check it was in is ``timeout``, the
    ones it had not started are ``skip``. A worker that crashed: the check it
    was in is ``error`` with the signal or exit status, and the worker is
    restarted for the rest. A worker that died before planning: one
    ``<group>.worker`` error (``<group>.worker.<part>`` for a part of a split group).
    """
    timed_out = run.exit_status is None
    how = (
        f"the group's time limit of {limit_s:.0f}s ran out"
        if timed_out
        else f"the group's process ended ({_exit_description(run.exit_status or 0)})"
    )
    tail = f"; last output: {run.log_tail}" if run.log_tail else ""
    if run.plan is None:
        meta = {"name": f"{group}.worker{part}", "gate": True, "impl": None, "workaround": None}
        status: Status = "timeout" if timed_out else "error"
        return [
            CheckResult.synthetic(meta, status, f"{how} before it planned its checks{tail}")
        ], False
    records: list[CheckResult] = []
    done = set(run.done)
    current = run.started[-1] if run.started and run.started[-1] not in done else None
    by_name = {str(m["name"]): m for m in run.plan} | dict(run.unplanned)
    if current is not None and current in by_name:
        status = "timeout" if timed_out else "error"
        records.append(
            CheckResult.synthetic(by_name[current], status, f"{how} during this check{tail}")
        )
        done.add(current)
    remaining = [m for m in run.plan if str(m["name"]) not in done]
    if not remaining:
        return records, False
    if timed_out or run.exit_status == 0:
        reason = (
            f"not started: {how}"
            if timed_out
            else "not started: the group's process ended without running it"
        )
        records.extend(CheckResult.synthetic(m, "skip", reason) for m in remaining)
        return records, False
    return records, elapsed_s < limit_s


def _log_tail(path: Path, limit: int = 600) -> str:
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

    def run(self, argv: Sequence[str], output: Path, timeout: float) -> int | None:
        """Run a worker in its own session; None when it was killed at the time limit."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        command = [self.python, "-m", "envbuilder.conformance.worker", *argv]
        with output.open("ab") as sink:
            proc = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
            try:
                return proc.wait(timeout=max(timeout, 1.0))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
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
                elif "preloaded" in message:
                    self.report = message
                elif "exited" in message:
                    self._exits[int(message["exited"])] = int(message["status"])
                self._changed.notify_all()
        with self._changed:
            self._lost = True
            self._changed.notify_all()

    def run(
        self, argv: Sequence[str], output: Path, timeout: float, *, after: str | None = None
    ) -> int | None:
        """Run a worker once the preload modules up to ``after`` are imported (all of them
        when None)."""
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            request = {"id": rid, "argv": list(argv), "output": str(output), "after": after}
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
                        f" {_log_tail(self._log_path, 300)}"
                    )
                raise ForkServerLost("the fork server did not fork the worker")
            pid, self.forked_with = self._forked.pop(rid)
        deadline = time.monotonic() + max(timeout, 1.0)  # from the fork, not the request
        with self._changed:
            finished = self._changed.wait_for(
                lambda: pid in self._exits or self._lost, max(deadline - time.monotonic(), 0)
            )
            if finished and pid in self._exits:
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

    def __init__(self, opts: RunOptions, workdir: Path, echo: Callable[[str], None]) -> None:
        self._spawner = Spawner(opts.python)
        self._server: ForkServer | None = None  # while forking
        self._used: ForkServer | None = None  # the server workers were forked from, if any
        self._error: str | None = None
        self._echo = echo
        if opts.fork_server:
            try:
                self._server = self._used = ForkServer(opts.python, workdir / "forkserver.log")
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
        if self._error is not None:
            notes["fork_server_error"] = self._error
        return notes

    def run(
        self, argv: Sequence[str], output: Path, timeout: float, *, after: str | None = None
    ) -> int | None:
        """Run a worker; forked, it waits for the preload modules up to ``after``."""
        server = self._server
        if server is not None:
            start = time.monotonic()
            try:
                return server.run(argv, output, timeout, after=after)
            except ForkServerLost as e:
                self.stop_forking(str(e))
                timeout -= time.monotonic() - start
        return self._spawner.run(argv, output, timeout)

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


def _ended(status: int | None) -> str:
    """How a worker ended, for a reason: ``None`` is the time limit."""
    return "timed out" if status is None else f"ended ({_exit_description(status)})"


def _run_group(
    group: str,
    opts: RunOptions,
    workdir: Path,
    launcher: Launcher,
    echo: Callable[[str], None],
    part: tuple[int, int] = (0, 1),
) -> dict[str, int]:
    """Run one group, or part ``I`` of ``N`` of it; returns the planned checks' positions in
    the whole group's plan."""
    index, count = part
    tag = group if count == 1 else f"{group}.{index}"
    limit = opts.timeout_for(group)
    start = time.monotonic()
    state = workdir / f"{tag}.state.jsonl"
    log = workdir / f"{tag}.log"
    argv = ["--group", group, "--jsonl", str(opts.jsonl), "--state", str(state)]
    if count > 1:
        argv += ["--shard", f"{index}/{count}"]
    if opts.device:
        argv += ["--device", opts.device]
    if opts.quick:
        argv.append("--quick")
    for pattern in opts.checks:
        argv += ["--checks", pattern]
    positions: dict[str, int] = {}
    for _attempt in range(200):
        state.unlink(missing_ok=True)
        status = launcher.run(
            argv, log, limit - (time.monotonic() - start), after=GROUP_MODULES[group]
        )
        lines = read_jsonl(state)
        planned = next((x for x in lines if "plan" in x), None)
        plan: tuple[Mapping[str, Any], ...] | None = None
        if planned is not None:
            plan = tuple(planned["plan"])
            spots = planned.get("positions", range(len(plan)))
            positions |= {str(m["name"]): int(p) for m, p in zip(plan, spots, strict=True)}
        run = GroupRun(
            plan=plan,
            started=tuple(str(x["start"]) for x in lines if "start" in x),
            unplanned={str(x["start"]): x["meta"] for x in lines if "start" in x and "meta" in x},
            done=frozenset(
                str(r.get("name")) for r in read_jsonl(opts.jsonl) if r.get("group") == group
            ),
            exit_status=status,
            log_tail=_log_tail(log) if status != 0 else "",
        )
        if status == 0 and plan is not None and all(str(m["name"]) in run.done for m in plan):
            return positions
        if plan is None and status != 0 and launcher.forking:
            # dead before its first check: the fork may be why; no forked child is trusted
            launcher.stop_forking(
                f"the {tag} group's forked process {_ended(status)} before it planned its checks;"
                f" last output: {_log_tail(log, 300)}"
            )
            continue
        records, again = settle(
            group,
            run,
            limit_s=limit,
            elapsed_s=time.monotonic() - start,
            part="" if count == 1 else f".{index}",
        )
        for record in records:
            append_jsonl(opts.jsonl, record.to_json())
        if records:
            echo(f"  ! {tag}: {records[0].status} in {records[0].name}: {records[0].reason[:300]}")
        if not again:
            return positions
    return positions


def _collect_runner(opts: RunOptions, workdir: Path, launcher: Launcher) -> dict[str, Any]:
    """Facts about the machine from a worker (``--runner-info``), with ``device`` in them."""
    fallback: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": "unknown",
        "torch_cuda": None,
        "xformers": None,
        "driver": None,
        "gpus": [],
        "device": opts.device or "cpu",
    }
    argv = ["--runner-info"]
    if opts.device:
        argv += ["--device", opts.device]
    out = workdir / "runner.json"
    status = launcher.run(argv, out, 180, after="torch")  # needs torch only
    if status != 0 and launcher.forking:
        # the first forked child to use CUDA: if it cannot, no forked child can
        launcher.stop_forking(
            f"the runner facts {_ended(status)} in a forked process;"
            f" last output: {_log_tail(out, 300)}"
        )
        out.unlink(missing_ok=True)
        status = launcher.run(argv, out, 180)
    if status != 0:
        return fallback
    # the worker prints the facts as its last line; warnings may come before it
    lines = out.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                info: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue
            return info
    return fallback


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a part.

    The suite runs inside images where envbuilder's own writer (`envbuilder.files`) is
    not importable, hence this copy; like that one it creates the file with mode 0666
    minus the umask (``mkstemp``'s 0600 would stick to the results file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_MARKS: Mapping[Status, str] = {
    "pass": "✓",
    "fail": "✕",
    "skip": "-",
    "error": "!",
    "timeout": "⏱",
    "invalid": "?",
}


@dataclass(frozen=True, kw_only=True)
class SuiteResults:
    """A results file (``envbuilder.results/2``, docs/contracts.md) as typed records."""

    suite_version: str
    combination: str | None
    lock_sha256: str | None
    started: str
    finished: str
    runner: Mapping[str, Any]
    checks: tuple[CheckResult, ...]
    schema: str = RESULTS_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "suite_version": self.suite_version,
            "combination": self.combination,
            "lock_sha256": self.lock_sha256,
            "started": self.started,
            "finished": self.finished,
            "runner": dict(self.runner),
            "checks": [c.to_json() for c in self.checks],
        }

    @property
    def failed_gates(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.gate and c.failed)

    @property
    def failed_direct_gates(self) -> tuple[CheckResult, ...]:
        """Failed gate checks that are not workaround checks: what makes the exit status 1."""
        return tuple(c for c in self.failed_gates if c.workaround is None)


def _line(check: CheckResult) -> str:
    gate = "gate" if check.gate else "info"
    text = (
        f"  {_MARKS[check.status]} {check.status:<7} {gate} {check.name} ({check.duration_s:.1f}s)"
    )
    if check.status != "pass" and check.reason:
        text += f": {check.reason[:240]}"
    return text


def summarize(results: SuiteResults) -> str:
    """The closing summary: counts by status, gates, and every failed direct gate check with
    its workaround checks."""
    checks = results.checks
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    gates = [c for c in checks if c.gate]
    direct = [c for c in gates if c.workaround is None]
    failed = results.failed_direct_gates
    runner = results.runner
    gpus = runner.get("gpus") or []
    gpu_text = ", ".join(f"{g['name']} (sm {g['compute_capability']})" for g in gpus) or "no GPU"
    lines = [
        f"conformance {results.suite_version} — {results.combination or 'current environment'}",
        f"  runner: torch {runner.get('torch')} (CUDA {runner.get('torch_cuda')}), xformers "
        f"{runner.get('xformers')}, {gpu_text}, driver {runner.get('driver')}",
        f"  {len(checks)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items()),
        f"  direct gates: {len(direct)} ({sum(1 for c in direct if c.status == 'pass')} pass, "
        f"{len(failed)} fail/error/timeout/invalid,"
        f" {sum(1 for c in direct if c.status == 'skip')} skip);"
        f" workaround checks: {len(gates) - len(direct)}"
        f" ({sum(1 for c in gates if c.workaround and c.status == 'pass')} pass)",
    ]
    covering: dict[str, list[CheckResult]] = {}
    for check in gates:
        if check.covers is not None:
            covering.setdefault(check.covers, []).append(check)
    for check in failed:
        lines.append(_line(check))
        for workaround in covering.get(check.name, []):
            lines.append("    " + _line(workaround).strip())
    return "\n".join(lines)


def _order(
    records: Sequence[Mapping[str, Any]], positions: Mapping[str, int] | None = None
) -> list[CheckResult]:
    """The checks of a JSONL stream, first record per name, in group order; within a group
    in plan order (``positions``: a check's place in its group's plan; a workaround check
    follows the check it covers), else in stream order."""
    seen: set[str] = set()
    checks: list[CheckResult] = []
    for record in records:
        name = str(record.get("name"))
        if name not in seen:
            seen.add(name)
            checks.append(CheckResult.from_json(record))
    rank = {group: i for i, group in enumerate(GROUPS)}
    places = positions or {}
    unplaced = len(checks)  # after every planned check, in stream order

    def key(item: tuple[int, CheckResult]) -> tuple[int, int, int, int]:
        index, check = item
        group = rank.get(check.group, len(rank))
        place = places.get(check.name)
        if place is not None:
            return group, place, 0, index
        covered = places.get(check.covers) if check.covers is not None else None
        if covered is not None:
            return group, covered, 1, index
        return group, unplaced, 2, index

    return [check for _, check in sorted(enumerate(checks), key=key)]


def _phases(groups: Sequence[str], jobs: int) -> list[list[str]]:
    """Batches of groups to run side by side: one group per batch when ``jobs`` is 1, else
    every other group together, then each solo group alone."""
    if jobs <= 1:
        return [[g] for g in groups]
    shared = [g for g in groups if g not in SOLO_GROUPS]
    return ([shared] if shared else []) + [[g] for g in groups if g in SOLO_GROUPS]


def _parts(opts: RunOptions, groups: Sequence[str], jobs: int, device: str) -> dict[str, int]:
    """How many processes each group is split across (never more than run at once)."""
    if opts.parts is not None:
        wanted = opts.parts
    elif device.startswith("cuda"):
        wanted = GPU_SHARDS
    else:
        wanted = {}
    return {g: max(1, min(wanted.get(g, 1), jobs)) for g in groups}


def run_suite(opts: RunOptions, *, echo: Callable[[str], None] = print) -> SuiteResults:
    """Run every selected group and write ``opts.out``; returns the results written."""
    started = _now()
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:
            echo(line)

    with tempfile.TemporaryDirectory(prefix="envbuilder-conformance-") as tmp:
        workdir = Path(tmp)
        launcher = Launcher(opts, workdir, say)
        try:
            runner = _collect_runner(opts, workdir, launcher)
            device = str(runner.pop("device", None) or opts.device or "cpu")
            if opts.require_cuda and not device.startswith("cuda"):
                raise NoCudaDevice(
                    "no CUDA GPU is visible to torch here"
                    if runner.get("torch") != "unknown"
                    else "torch did not report this machine's devices (the runner facts failed)"
                )
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            opts.jsonl.write_text("", encoding="utf-8")
            jobs = opts.jobs or (GPU_JOBS if device.startswith("cuda") else 1)
            groups = [
                g for g in groups_for(opts.checks) if not opts.quick or g not in FULL_ONLY_GROUPS
            ]

            parts = _parts(opts, groups, jobs, device)
            positions: dict[str, int] = {}
            begun: dict[str, float] = {}
            left = dict(parts)

            def one(group: str, index: int) -> None:
                with printing:
                    if group not in begun:
                        begun[group] = time.monotonic()
                        split = f" ({parts[group]} processes)" if parts[group] > 1 else ""
                        echo(f"▶ {group}{split}")
                found = _run_group(group, opts, workdir, launcher, say, (index, parts[group]))
                with printing:
                    positions.update(found)
                    left[group] -= 1
                    if left[group]:
                        return
                    new = _order(
                        [r for r in read_jsonl(opts.jsonl) if r.get("group") == group], positions
                    )
                    lines = [_line(check) for check in new]
                    lines.append(
                        f"  {group}: {len(new)} checks in {time.monotonic() - begun[group]:.1f}s"
                    )
                    echo("\n".join(lines))

            for phase in _phases(groups, jobs):
                items = [(g, i) for g in phase for i in range(parts[g])]
                if len(items) == 1:
                    one(*items[0])
                    continue
                with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="group") as pool:
                    for future in [pool.submit(one, g, i) for g, i in items]:
                        future.result()
            split = {g: n for g, n in parts.items() if n > 1}
            runner["launch"] = dict(launcher.notes) | {"jobs": jobs, "parts": split}
        finally:
            launcher.close()
    checks = _order(read_jsonl(opts.jsonl), positions)
    if not checks and any(opts.checks):
        raise NoChecksSelected(
            f"no check matches --checks {' '.join(opts.checks)}; nothing was written to"
            f" {opts.out}. Names look like attention.sdpa.none.fp16 or compile.xformers.*;"
            " a group name (attention) selects the whole group"
        )
    results = SuiteResults(
        suite_version=SUITE_VERSION,
        combination=opts.combination,
        lock_sha256=opts.lock_sha256,
        started=started,
        finished=_now(),
        runner=runner,
        checks=tuple(checks),
    )
    text = json.dumps(results.to_json(), indent=2, sort_keys=False, allow_nan=False)
    write_atomic(opts.out, text + "\n")
    return results
