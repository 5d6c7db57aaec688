"""Runs the check groups, each in its own process with a time limit, and writes the results.

The runner never imports torch: a group that segfaults, raises a CUDA error or
hangs is killed and recorded (``error``/``timeout`` on the check it was in,
from the worker's state file) and the remaining groups still run. Every result
is in ``<out>.jsonl`` the moment it finishes; ``<out>`` is written atomically
at the end.

What runs is read from the group registry (``groups.py``); how processes are
started is ``launch.py`` (forked from a server that imported torch once, else
fresh), in what order and how many ``schedule.py`` (from the measured costs in
``costs.py``), and the results file ``results.py``.
"""

from __future__ import annotations

import json
import platform
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuilder.conformance import SUITE_VERSION, costs, schedule
from envbuilder.conformance._record import CheckResult, Status, append_jsonl, read_jsonl
from envbuilder.conformance.groups import group
from envbuilder.conformance.launch import Launcher, exit_description, log_tail
from envbuilder.conformance.results import (
    SuiteResults,
    check_line,
    now,
    order,
    summarize,
    unmatched_patterns,
    write_atomic,
)
from envbuilder.conformance.schedule import GPU_JOBS, groups_for, pattern_problems

__all__ = [
    "GPU_JOBS",
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


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    out: Path
    checks: tuple[str, ...] = ()
    device: str | None = None
    quick: bool = False
    combination: str | None = None
    lock_sha256: str | None = None
    #: seconds a group's process may take, by group (default: the group's own limit)
    timeouts: Mapping[str, float] = field(default_factory=dict)
    #: seconds one check may run, counted from its start: past it the check is ``timeout``
    #: and the worker is restarted for the rest while its group has time (None: no limit
    #: but the group's)
    check_timeout: float | None = None
    python: str = sys.executable
    #: groups run at once (None: GPU_JOBS on a GPU, else 1)
    jobs: int | None = None
    #: fork group processes from a server that imported torch once
    fork_server: bool = True
    #: processes a group is split across (None: from the measured costs when groups run
    #: side by side on a GPU, else one each)
    parts: Mapping[str, int] | None = None
    #: stop before any check (raising NoCudaDevice) when no CUDA device is visible
    require_cuda: bool = False
    #: measured seconds per unit (``costs.py``) the processes are planned and dealt by
    #: (None: the suite's table for the run size)
    costs: Mapping[str, float] | None = None

    @property
    def jsonl(self) -> Path:
        return self.out.with_name(self.out.name + ".jsonl")

    def timeout_for(self, name: str) -> float:
        if name in self.timeouts:
            return self.timeouts[name]
        return group(name).timeout(quick=self.quick)

    @property
    def size(self) -> str:
        """The run size the cost table is kept by."""
        return "quick" if self.quick else "full"

    def unit_costs(self) -> Mapping[str, float]:
        return costs.known_costs(self.size) if self.costs is None else self.costs


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
    #: with exit_status None: killed because its check ran this long, not at the group's limit
    check_limit_s: float | None = None


class NoCudaDevice(RuntimeError):
    """The run needs a CUDA device and the runner facts found none: nothing is written."""


class NoChecksSelected(ValueError):
    """``--checks`` patterns selected no check: nothing is written."""


def settle(
    group: str, run: GroupRun, *, limit_s: float, elapsed_s: float, part: str = ""
) -> tuple[list[CheckResult], bool]:
    """Results for what a dead or killed worker could not report, and whether to restart it.

    A worker killed at the time limit: the check it was in is ``timeout``, the
    ones it had not started are ``skip``. A worker that crashed, or was killed at
    its check's own limit: the check it was in is ``error`` with the signal or exit
    status (``timeout``), and the worker is restarted for the rest. A worker that
    died before planning: one ``<group>.worker`` error (``<group>.worker.<part>``
    for a part of a split group).
    """
    timed_out = run.exit_status is None
    if timed_out and run.check_limit_s is not None:
        how = f"the check's time limit of {run.check_limit_s:.0f}s ran out"
    elif timed_out:
        how = f"the group's time limit of {limit_s:.0f}s ran out"
    else:
        how = f"the group's process ended ({exit_description(run.exit_status or 0)})"
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
    if (timed_out and run.check_limit_s is None) or run.exit_status == 0:
        reason = (
            f"not started: {how}"
            if timed_out
            else "not started: the group's process ended without running it"
        )
        records.extend(CheckResult.synthetic(m, "skip", reason) for m in remaining)
        return records, False
    return records, elapsed_s < limit_s


class _CheckClock:
    """Whether the check a worker is in has run longer than ``limit_s``, timed from its
    ``start`` line in the worker's state file as the launcher polls (a finished check's
    worker, between checks or ending, is never past it)."""

    def __init__(self, state: Path, jsonl: Path, limit_s: float) -> None:
        self._state, self._jsonl, self.limit_s = state, jsonl, limit_s
        self._started = 0
        self._since = time.monotonic()
        self.overran = False

    def __call__(self) -> bool:
        started = [str(x["start"]) for x in read_jsonl(self._state) if "start" in x]
        if len(started) != self._started:
            self._started, self._since = len(started), time.monotonic()
        if not started or time.monotonic() - self._since <= self.limit_s:
            return False
        done = {r.get("name") for r in read_jsonl(self._jsonl)}
        self.overran = started[-1] not in done
        return self.overran


def _ended(status: int | None) -> str:
    """How a worker ended, for a reason: ``None`` is the time limit."""
    return "timed out" if status is None else f"ended ({exit_description(status)})"


def _run_group(
    name: str,
    opts: RunOptions,
    workdir: Path,
    launcher: Launcher,
    echo: Callable[[str], None],
    part: tuple[int, int] = (0, 1),
) -> dict[str, int]:
    """Run one group, or part ``I`` of ``N`` of it; returns the planned checks' positions in
    the whole group's plan."""
    spec = group(name)
    index, count = part
    tag = name if count == 1 else f"{name}.{index}"
    limit = opts.timeout_for(name)
    start = time.monotonic()
    state = workdir / f"{tag}.state.jsonl"
    log = workdir / f"{tag}.log"
    argv = _worker_argv(name, opts, workdir, state, part)
    positions: dict[str, int] = {}
    for _attempt in range(200):
        state.unlink(missing_ok=True)
        clock = (
            None
            if opts.check_timeout is None
            else _CheckClock(state, opts.jsonl, opts.check_timeout)
        )
        status = launcher.run(
            argv, log, limit - (time.monotonic() - start), after=spec.preload_after, stop=clock
        )
        run = _group_run(name, opts, state, log, status, clock, positions)
        if (
            status == 0
            and run.plan is not None
            and all(str(m["name"]) in run.done for m in run.plan)
        ):
            return positions
        if run.plan is None and status != 0 and launcher.forking:
            # dead before its first check: the fork may be why; no forked child is trusted
            launcher.stop_forking(
                f"the {tag} group's forked process {_ended(status)} before it planned its checks;"
                f" last output: {log_tail(log, 300)}"
            )
            continue
        records, again = settle(
            name,
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


def _worker_argv(
    name: str, opts: RunOptions, workdir: Path, state: Path, part: tuple[int, int]
) -> list[str]:
    """The worker's arguments for one group, or part ``I`` of ``N`` of it."""
    spec = group(name)
    index, count = part
    argv = ["--group", name, "--module", spec.module]
    argv += ["--jsonl", str(opts.jsonl), "--state", str(state)]
    if spec.shard_unit_parts is not None:
        argv += ["--unit-parts", str(spec.shard_unit_parts)]
    if count > 1:
        argv += ["--shard", f"{index}/{count}", "--costs", str(workdir / "costs.json")]
    if opts.device:
        argv += ["--device", opts.device]
    if opts.quick:
        argv.append("--quick")
    for pattern in opts.checks:
        argv += ["--checks", pattern]
    return argv


def _group_run(
    name: str,
    opts: RunOptions,
    state: Path,
    log: Path,
    status: int | None,
    clock: _CheckClock | None,
    positions: dict[str, int],
) -> GroupRun:
    """What one worker process of a group left in its state file and the results, read
    after it ended; the positions of the checks it planned are added to ``positions``."""
    lines = read_jsonl(state)
    planned = next((x for x in lines if "plan" in x), None)
    plan: tuple[Mapping[str, Any], ...] | None = None
    if planned is not None:
        plan = tuple(planned["plan"])
        spots = planned.get("positions", range(len(plan)))
        positions |= {str(m["name"]): int(p) for m, p in zip(plan, spots, strict=True)}
    return GroupRun(
        plan=plan,
        started=tuple(str(x["start"]) for x in lines if "start" in x),
        unplanned={str(x["start"]): x["meta"] for x in lines if "start" in x and "meta" in x},
        done=frozenset(
            str(r.get("name")) for r in read_jsonl(opts.jsonl) if r.get("group") == name
        ),
        exit_status=status,
        log_tail=log_tail(log) if status != 0 else "",
        check_limit_s=clock.limit_s if clock is not None and clock.overran else None,
    )


def _collect_runner(
    opts: RunOptions, workdir: Path, launcher: Launcher, *, hold: bool = False
) -> dict[str, Any]:
    """Facts about the machine from a worker (``--runner-info``), with ``device`` in them.

    ``hold``: the fork server pauses its preloading until the next request, which then
    forks at once: a group that runs alone starts while the slow imports go on."""
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
    status = launcher.run(argv, out, 180, after="torch", hold=hold)  # needs torch only
    if status != 0 and launcher.forking:
        # the first forked child to use CUDA: if it cannot, no forked child can
        launcher.stop_forking(
            f"the runner facts {_ended(status)} in a forked process;"
            f" last output: {log_tail(out, 300)}"
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


def run_suite(opts: RunOptions, *, echo: Callable[[str], None] = print) -> SuiteResults:
    """Run every selected group and write ``opts.out``; returns the results written."""
    started = now()
    console = _Console(echo)
    positions: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="envbuilder-conformance-") as tmp:
        workdir = Path(tmp)
        launcher = Launcher(opts.python, workdir, console.say, fork_server=opts.fork_server)
        try:
            runner = _run_groups(opts, workdir, launcher, console, positions)
        finally:
            launcher.close()
    checks = order(read_jsonl(opts.jsonl), positions)
    if not checks and any(opts.checks):
        raise NoChecksSelected(
            f"no check matches --checks {' '.join(opts.checks)}; nothing was written to"
            f" {opts.out}. Names look like attention.sdpa.none.fp16 or compile.xformers.*;"
            " a group name (attention) selects the whole group"
        )
    return _write_results(opts, started, runner, checks)


class _Console:
    """The user's lines from groups running side by side, each message whole: ``say`` one
    line, or hold ``lock`` and ``echo`` several."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.lock = threading.Lock()

    def say(self, line: str) -> None:
        with self.lock:
            self.echo(line)


def _run_groups(
    opts: RunOptions,
    workdir: Path,
    launcher: Launcher,
    console: _Console,
    positions: dict[str, int],
) -> dict[str, Any]:
    """Run the selected groups, phase by phase (`schedule.phases`), their parts side by
    side; returns the runner facts with how they were launched (``launch``)."""
    wanted = groups_for(opts.checks)
    alone_first = opts.jobs != 1 and any(group(g).runs_alone for g in wanted)
    runner = _collect_runner(opts, workdir, launcher, hold=alone_first)
    device = _device(opts, runner)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.jsonl.write_text("", encoding="utf-8")
    jobs = opts.jobs or (GPU_JOBS if device.startswith("cuda") else 1)
    names = [g for g in wanted if not (opts.quick and group(g).full_only)]
    table = opts.unit_costs()
    # every process of a group deals its units by the same table as the schedule
    (workdir / "costs.json").write_text(json.dumps(dict(table)), encoding="utf-8")
    counts = schedule.parts(names, jobs=jobs, table=table, patterns=opts.checks, fixed=opts.parts)
    one = _GroupParts(opts, workdir, launcher, console, counts, positions)
    timings: dict[str, float] = {}
    for batch in schedule.phases(names, jobs):
        began = time.monotonic()
        items = schedule.plan_parts(batch, counts, table=table, patterns=opts.checks)
        if len(items) == 1:
            one(items[0])
        else:
            with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="group") as pool:
                for future in [pool.submit(one, item) for item in items]:
                    future.result()
        timings["+".join(batch)] = round(time.monotonic() - began, 3)
    split = {g: n for g, n in counts.items() if n > 1}
    runner["launch"] = dict(launcher.notes) | {
        "jobs": jobs,
        "parts": split,
        "phase_s": timings,
    }
    return runner


def _device(opts: RunOptions, runner: dict[str, Any]) -> str:
    """The device the runner facts name (taken out of them); NoCudaDevice where the run
    needs CUDA and it is not a CUDA device."""
    device = str(runner.pop("device", None) or opts.device or "cpu")
    if opts.require_cuda and not device.startswith("cuda"):
        raise NoCudaDevice(
            "no CUDA GPU is visible to torch here"
            if runner.get("torch") != "unknown"
            else "torch did not report this machine's devices (the runner facts failed)"
        )
    return device


class _GroupParts:
    """Runs one part of a group (threads run parts side by side); announces a group as its
    first part starts and prints its checks once its last part is done."""

    def __init__(
        self,
        opts: RunOptions,
        workdir: Path,
        launcher: Launcher,
        console: _Console,
        counts: Mapping[str, int],
        positions: dict[str, int],
    ) -> None:
        self._opts, self._workdir, self._launcher = opts, workdir, launcher
        self._console, self._positions = console, positions
        self._begun: dict[str, float] = {}
        self._left = dict(counts)

    def __call__(self, part: schedule.Part) -> None:
        name, console = part.group, self._console
        with console.lock:
            if name not in self._begun:
                self._begun[name] = time.monotonic()
                split = f" ({part.count} processes)" if part.count > 1 else ""
                console.echo(f"▶ {name}{split}")
        found = _run_group(
            name, self._opts, self._workdir, self._launcher, console.say, (part.index, part.count)
        )
        with console.lock:
            self._positions.update(found)
            self._left[name] -= 1
            if self._left[name]:
                return
            new = order(
                [r for r in read_jsonl(self._opts.jsonl) if r.get("group") == name],
                self._positions,
            )
            lines = [check_line(check) for check in new]
            lines.append(
                f"  {name}: {len(new)} checks in {time.monotonic() - self._begun[name]:.1f}s"
            )
            console.echo("\n".join(lines))


def _write_results(
    opts: RunOptions, started: str, runner: dict[str, Any], checks: list[CheckResult]
) -> SuiteResults:
    """The results of the run, written atomically to ``opts.out``."""
    results = SuiteResults(
        suite_version=SUITE_VERSION,
        combination=opts.combination,
        lock_sha256=opts.lock_sha256,
        started=started,
        finished=now(),
        runner=runner,
        checks=tuple(checks),
    )
    text = json.dumps(results.to_json(), indent=2, sort_keys=False, allow_nan=False)
    write_atomic(opts.out, text + "\n")
    return results
