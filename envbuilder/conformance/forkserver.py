"""A process that imports torch once and forks one child per check group.

    python -m envbuilder.conformance.forkserver

Importing torch (and dynamo, inductor, diffusers) costs seconds per process,
more on a machine whose disk cache is cold. The server pays it once: it
imports the preload modules *without touching CUDA*, then forks a child per
request. Each child is still its own process in its own session (the runner
kills its process group at the time limit; a segfault kills only the child),
and initialises CUDA itself, as a freshly started worker would.

Importing torch starts a native thread; forking a process that has one is
what torch's own fork-based DataLoader workers do, and the child does not
rely on it. The number of threads at fork time is reported.

CUDA does not survive a fork once the driver is initialised. The server
imports with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (``torch.cuda.is_available()``
then asks NVML, not the driver), and after each preload module it asks the
driver, if mapped, whether it is initialised. If a module did initialise it,
the server starts over (``exec``) without that module, and says so. To spare
that second import of everything, a probe process forked once torch is in
imports the other preload modules from the last one backwards and reports
each that initialises the driver (then stops): the server skips a module the
probe has reported, and waits for the probe's verdict on a module the probe
is importing at that moment. The runner's first child (the runner facts)
uses CUDA: if that fails in a forked child, the runner stops forking.

Each request waits only for the preload modules it needs: those up to its
``after`` module in the preload order (all of them when ``after`` is not in
the list), so that a group starts while the modules only later groups use
are still being imported. The default order puts each group's module after
what that group imports.

Protocol, one JSON object per line. The server writes ``{"ready": true}``
once the first preload module (torch) is imported, and from then on reads
requests ``{"id": ID, "argv": [...], "output": PATH, "after": MODULE}``
(worker arguments; the child's stdout and stderr are appended to
``output``), answering ``{"id": ID, "pid": PID, "preloaded": [modules the
child has]}`` for each once the modules it needs are through, in the order
the requests came among those ready at the same time. A request with
``"hold": true`` pauses the preloading before the next module until one with
``"resume": true`` arrives (at most ``HOLD_S`` seconds): the request that
follows a short first child is then forked at once, not after a slow import. When every preload
module is through it writes ``{"preloaded": [...], "skipped": {module:
why}, "import_s": S, "module_s": {module: S}, "threads": N}``
(``module_s``: seconds spent importing each module, summed over restarts);
when a child ends, ``{"exited": PID, "status": S}`` (S as ``subprocess``:
negative for a signal). It exits when its input closes, killing the
children still running.

Once ``WARM_AFTER`` (inductor) is imported, the server forks a process that probes
inductor's CPU vector instruction set (``_warm.CpuIsa``: a compiler and a Python process
per instruction set, 31 s on a fresh H200 host, which every check process compiling a
CPU kernel paid again). When its answers arrive, the server fills torch's caches with
them and writes ``{"warmed": {"cpu_vec_isa": {"seconds": S, "isa": ..., "probed":
[...], ...}}}`` (or ``{"error": ...}``); each later answer's ``"warmed"`` lists it: that
child finds the answer in memory. A child forked before probes for itself, as without
the server. ``ENVBUILDER_CONFORMANCE_WARM=0`` turns this off.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from envbuilder.conformance.groups import preload_order

__all__ = [
    "DEFAULT_PRELOAD",
    "DRIVER_LIBRARIES",
    "PRELOAD_VARIABLE",
    "driver_initialised",
    "driver_mapped",
    "main",
]

#: imported before any fork, in this order; an absent module is skipped. From the group
#: registry (``groups.preload_order``): torch, the check modules that need nothing more,
#: then each slow import (dynamo and inductor, diffusers) followed by the groups that use it.
DEFAULT_PRELOAD: tuple[str, ...] = preload_order()

#: the longest a ``hold`` request pauses the preloading without a ``resume`` request
HOLD_S = 60.0

#: a comma-separated preload list replacing the default (``""``: torch only is not implied).
PRELOAD_VARIABLE = "ENVBUILDER_CONFORMANCE_PRELOAD"

#: after this preload module the server has inductor's CPU vector ISA probed in a process
#: of its own (``_warm.CpuIsa``): children forked once the answer is in do not probe it
WARM_AFTER = "torch._inductor.compile_fx"

#: ``"0"``: no background work (each check process probes the CPU's ISA itself, as before)
WARM_VARIABLE = "ENVBUILDER_CONFORMANCE_WARM"

#: the CUDA driver's shared object.
DRIVER_LIBRARIES: tuple[str, ...] = ("libcuda.so",)

_RESTART_FLAG = "--restart"

#: makes ``torch.cuda.is_available()`` ask NVML instead of initialising the driver, so that
#: a preload module that asks does not make the fork unsafe; children get the caller's value.
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
#: what a restarted image must know: the modules to skip, and whether the variable is ours
_state: dict[str, Any] = {
    "skipped": {},
    "nvml_set": False,
    "announced": False,
    "children": [],
    "pending": "",
    "queue": [],
    "channel_fd": 1,
    "started": 0.0,
    "times": {},
    "restarted": False,
}


def driver_mapped(maps: str, libraries: Iterable[str] = DRIVER_LIBRARIES) -> str | None:
    """The path of the first driver library mapped in a ``/proc/<pid>/maps`` text, or None."""
    names = tuple(libraries)
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1] if "/" in line else ""
        base = path.rsplit("/", 1)[-1]
        if any(base.startswith(name) for name in names):
            return path
    return None


#: ``cuCtxGetCurrent``'s answer before ``cuInit``: the driver is loaded but not initialised.
CUDA_ERROR_NOT_INITIALIZED = 3


def driver_initialised(maps: str) -> str | None:
    """Why forking now would be unsafe: the CUDA driver is initialised (or might be); None
    when it is not loaded, or loaded and not initialised.

    torch maps the driver library when it is imported, without initialising it, so being
    mapped is not enough; the driver itself answers, without initialising anything:
    ``cuCtxGetCurrent`` returns CUDA_ERROR_NOT_INITIALIZED until ``cuInit`` ran."""
    path = driver_mapped(maps)
    if path is None:
        return None
    base = path.rsplit("/", 1)[-1]
    try:
        import ctypes

        function = ctypes.CDLL(path).cuCtxGetCurrent  # the mapped copy: no second load
        context = ctypes.c_void_p()
        answer = int(function(ctypes.byref(context)))
    except (OSError, AttributeError) as e:
        return f"{base} is loaded and cannot say whether it is initialised ({e})"
    if answer == CUDA_ERROR_NOT_INITIALIZED:
        return None
    return f"{base} is initialised (cuCtxGetCurrent returned {answer})"


def _own_maps() -> str:
    try:
        return Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _preload_list() -> list[str]:
    value = os.environ.get(PRELOAD_VARIABLE)
    if value is None:
        return list(DEFAULT_PRELOAD)
    return [m.strip() for m in value.split(",") if m.strip()]


class Probe:
    """A forked process that imports preload modules, from the last one backwards, and
    reports each one that initialises the CUDA driver; it stops at the first such module.

    Lines on its pipe: ``{"start": M}`` before importing M, ``{"done": M}`` after a
    harmless import (or a failed one: the server finds that out itself), ``{"unsafe": M,
    "why": ...}``."""

    #: the longest the server waits for the probe's verdict on the module it is importing
    WAIT_S = 120.0

    def __init__(self, modules: Sequence[str], closing: Sequence[int]) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _probe(list(reversed(modules)), write, closing)
        os.close(write)
        self.pid = pid
        self.fd: int | None = read
        self.pending = ""
        self.current: str | None = None  # the module it is importing now
        self.unsafe: dict[str, str] = {}

    def poll(self, timeout: float = 0.0) -> None:
        if self.fd is None:
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return
        chunk = os.read(self.fd, 65536).decode("utf-8", errors="replace")
        if not chunk:
            self.close()
            return
        self.pending += chunk
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            message = json.loads(line)
            if "start" in message:
                self.current = str(message["start"])
            elif "unsafe" in message:
                self.unsafe[str(message["unsafe"])] = str(message["why"])
                self.current = None
            else:
                self.current = None

    def verdict(self, module: str) -> str | None:
        """Why importing ``module`` would initialise the driver, as the probe found; waits
        while the probe is importing it. None: not known to."""
        self.poll()
        deadline = time.monotonic() + self.WAIT_S
        while self.fd is not None and self.current == module and time.monotonic() < deadline:
            self.poll(0.05)
        return self.unsafe.get(module)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.current = None

    def stop(self) -> None:
        self.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # the server's reaping may have been first
            os.waitpid(self.pid, 0)


def _probe(modules: Sequence[str], fd: int, closing: Sequence[int]) -> None:
    """In the probe process: import ``modules`` in order, say which initialises the driver."""
    code = 0
    try:
        for other in closing:
            with contextlib.suppress(OSError):
                os.close(other)
        with os.fdopen(fd, "w", buffering=1, encoding="utf-8") as out:
            for name in modules:
                out.write(json.dumps({"start": name}) + "\n")
                try:
                    importlib.import_module(name)
                except Exception:  # the server will find out for itself
                    out.write(json.dumps({"done": name}) + "\n")
                    continue
                unsafe = driver_initialised(_own_maps())
                if unsafe is not None:
                    out.write(json.dumps({"unsafe": name, "why": unsafe}) + "\n")
                    break
                out.write(json.dumps({"done": name}) + "\n")
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _preload(
    modules: Sequence[str], skipped: dict[str, str], server: Server | None = None
) -> list[str]:
    """Import ``modules``; start over without one that initialises the CUDA driver.

    With a ``server``: a probe runs ahead (see the module's docstring), and between
    imports the server forks for the requests whose modules are through. The new
    process image inherits the protocol channel, the children and the requests not
    yet answered."""
    through: set[str] = server.through if server is not None else set()
    loaded: list[str] = []
    probe: Probe | None = None
    try:
        for name in modules:
            if server is not None:
                server.hold()
            if name in skipped:
                through.add(name)
                continue
            found = probe.verdict(name) if probe is not None else None
            if found is not None:
                skipped[name] = f"importing it in a probe process, {found}; a fork would break CUDA"
                through.add(name)
                continue
            began = time.monotonic()
            try:
                importlib.import_module(name)
            except Exception as e:  # absent or broken: the child imports it (and reports) itself
                skipped[name] = f"{type(e).__name__}: {e}"[:300]
                through.add(name)
                continue
            finally:  # per image: a restarted server imports its modules again
                times = _state["times"]
                times[name] = round(times.get(name, 0.0) + time.monotonic() - began, 3)
            unsafe = driver_initialised(_own_maps())
            if unsafe is not None:
                skipped[name] = f"after importing it, {unsafe}; a fork would break CUDA"
                if probe is not None:
                    probe.stop()
                if server is not None:
                    _state.update(
                        children=sorted(server.children),
                        pending=server.pending,
                        queue=server.queue,
                    )
                args = [sys.executable, "-m", "envbuilder.conformance.forkserver"]
                args += [_RESTART_FLAG, json.dumps(_state | {"skipped": skipped})]
                sys.stdout.flush()
                sys.stderr.flush()
                os.execv(sys.executable, args)
            loaded.append(name)
            through.add(name)
            if server is None:
                continue
            if name == WARM_AFTER:
                server.warm()
            server.loaded = list(loaded)
            server.announce()
            if probe is None and not _state["restarted"]:
                later = [m for m in modules if m not in through and m not in skipped]
                if later:
                    probe = Probe(later, (server.requests_fd, server.channel_fd))
            server.step(0)
    finally:
        if probe is not None:
            probe.stop()
    return loaded


def _thread_count() -> int:
    try:
        return sum(1 for _ in Path("/proc/self/task").iterdir())
    except OSError:
        return 1


def _child(argv: Sequence[str], output: str, channel: int) -> None:
    """In the forked child: a session of its own, output to ``output``, run the worker."""
    code = 1
    try:
        os.setsid()
        os.close(channel)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fds 0-2 stay open for the process
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from envbuilder.conformance import worker

        if _state["nvml_set"]:
            os.environ.pop(_NVML_CHECK, None)
        sys.argv = ["envbuilder.conformance.worker", *argv]
        code = worker.main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


class Server:
    """Forks a child per request line and reports each child's end."""

    def __init__(self, requests_fd: int, channel_fd: int) -> None:
        self.requests_fd = requests_fd
        self.channel_fd = channel_fd
        self.channel = os.fdopen(channel_fd, "w", buffering=1, encoding="utf-8", closefd=False)
        self.children: set[int] = set(_state["children"])
        self.pending: str = _state["pending"]
        self.queue: list[dict[str, Any]] = list(_state["queue"])  # requests not yet answered
        self.closed = False
        self.loaded: list[str] = []  # the preload modules a child forked now has
        self.modules: list[str] = []  # the preload list, in order
        self.through: set[str] = set()  # preload modules imported or skipped
        self.preloading = True  # until main() says the preload is through
        #: preloading paused by a ``hold`` request until a ``resume`` one (or HOLD_S)
        self.holding = False
        self.hold_until = 0.0
        self.warming: list[Any] = []  # background work not yet reported (``_warm``)
        self.warmed: list[str] = []  # what a child forked now finds done

    def warm(self) -> None:
        """Start the background work (unless ``WARM_VARIABLE`` is ``"0"``)."""
        if os.environ.get(WARM_VARIABLE, "1") == "0":
            return
        from envbuilder.conformance._warm import CpuIsa

        work = CpuIsa()
        try:
            work.start(closing=(self.requests_fd, self.channel_fd))
        except Exception as e:  # the check processes probe for themselves
            self.send({"warmed": {work.name: {"error": f"{type(e).__name__}: {e}"[:300]}}})
            return
        self.warming.append(work)

    def report_warmed(self) -> None:
        for work in [w for w in self.warming if w.done()]:
            self.warming.remove(work)
            report = work.report()
            if "error" not in report:
                self.warmed.append(work.name)
            self.send({"warmed": {work.name: report}})

    def send(self, message: dict[str, Any]) -> None:
        self.channel.write(json.dumps(message) + "\n")
        self.channel.flush()

    def announce(self) -> None:
        """Say once (across restarts) that requests are answered from now on."""
        if not _state["announced"]:
            _state["announced"] = True
            self.send({"ready": True})

    def reap(self) -> None:
        while self.children:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self.send({"exited": pid, "status": _status(wait_status)})

    def wants(self, request: dict[str, Any]) -> bool:
        """Whether a request's modules are through: those up to its ``after`` module in the
        preload order, or all of them."""
        if not self.preloading:
            return True
        after = request.get("after")
        if after not in self.modules:
            return False
        needed = self.modules[: self.modules.index(after) + 1]
        return all(m in self.through for m in needed)

    def hold(self) -> None:
        """While a ``hold`` request's pause lasts, answer requests instead of importing."""
        while self.holding and not self.closed:
            if time.monotonic() >= self.hold_until:
                self.holding = False
                break
            self.step(0.05)

    def step(self, timeout: float) -> None:
        """Read the requests that arrive within ``timeout`` seconds, fork for those whose
        modules are through and report ended children."""
        ready, _, _ = select.select([self.requests_fd], [], [], timeout)
        self.reap()
        self.report_warmed()
        if ready:
            chunk = os.read(self.requests_fd, 65536).decode("utf-8")
            if not chunk:
                self.closed = True
            self.pending += chunk
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                if line.strip():
                    request = json.loads(line)
                    if request.get("hold"):
                        self.holding = True
                        self.hold_until = time.monotonic() + HOLD_S
                    if request.get("resume"):
                        self.holding = False
                    self.queue.append(request)
        waiting: list[dict[str, Any]] = []
        for request in self.queue:
            if not self.wants(request):
                waiting.append(request)
                continue
            pid = os.fork()
            if pid == 0:
                _child([str(a) for a in request["argv"]], str(request["output"]), self.channel_fd)
            self.children.add(pid)
            self.send(
                {
                    "id": request.get("id"),
                    "pid": pid,
                    "preloaded": self.loaded,
                    "warmed": self.warmed,
                }
            )
        self.queue = waiting

    def serve(self) -> None:
        """Until the requests end; then the children still running are killed."""
        try:
            while not self.closed:
                self.step(0.05)
        finally:
            for pid in self.children:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == _RESTART_FLAG:
        _state.update(json.loads(args[1]))
        _state["restarted"] = True
    else:
        # the protocol owns the original stdout; whatever the imports print goes to stderr
        _state["channel_fd"] = os.dup(1)
        os.set_inheritable(_state["channel_fd"], True)
        os.dup2(2, 1)
        _state["started"] = time.time()
        if _NVML_CHECK not in os.environ:
            os.environ[_NVML_CHECK] = "1"
            _state["nvml_set"] = True
    channel_fd = int(_state["channel_fd"])
    server = Server(0, channel_fd)
    skipped: dict[str, str] = dict(_state["skipped"])
    modules = _preload_list()
    server.modules = modules
    if not modules:
        server.announce()
    loaded = _preload(modules, skipped, server)
    server.announce()
    server.preloading = False
    server.send(
        {
            "preloaded": loaded,
            "skipped": skipped,
            "import_s": round(time.time() - float(_state["started"]), 3),
            "module_s": dict(_state["times"]),
            "threads": _thread_count(),
        }
    )
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
