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
the server starts over (``exec``) without that module, and says so. The
runner's first child (the runner facts) uses CUDA: if that fails in a forked
child, the runner stops forking.

Protocol, one JSON object per line. The server writes ``{"ready": true}``
once the first preload module (torch) is imported, and from then on reads
requests ``{"argv": [...], "output": PATH, "early": bool}`` (worker
arguments; the child's stdout and stderr are appended to ``output``),
answering ``{"pid": PID, "preloaded": [modules the child has]}`` for each,
in order. A request marked ``early`` (the runner facts: torch is all they
need) is answered between the later preload imports; the others wait until
every preload module is imported, so that the groups get all of them. When every preload module
is imported it writes ``{"preloaded": [...], "skipped": {module: why},
"import_s": S, "threads": N}``; when a child ends, ``{"exited": PID,
"status": S}`` (S as ``subprocess``: negative for a signal). It exits when
its input closes, killing the children still running.
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

__all__ = [
    "DEFAULT_PRELOAD",
    "DRIVER_LIBRARIES",
    "PRELOAD_VARIABLE",
    "driver_initialised",
    "driver_mapped",
    "main",
]

#: imported before any fork, in this order; an absent module is skipped.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "envbuilder.conformance.checks_attention",
    "envbuilder.conformance.checks_compile",
    "envbuilder.conformance.checks_model",
    "diffusers.models.transformers.transformer_qwenimage",
)

#: a comma-separated preload list replacing the default (``""``: torch only is not implied).
PRELOAD_VARIABLE = "ENVBUILDER_CONFORMANCE_PRELOAD"

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


def _preload(
    modules: Sequence[str], skipped: dict[str, str], server: Server | None = None
) -> list[str]:
    """Import ``modules``; start over without one that initialises the CUDA driver.

    Between imports the server answers the early requests that arrived (the
    runner facts need torch only). The new process image inherits the protocol
    channel, the children and the requests not yet answered."""
    loaded: list[str] = []
    for name in modules:
        if name in skipped:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # absent or broken: the child imports it (and reports) itself
            skipped[name] = f"{type(e).__name__}: {e}"[:300]
            continue
        unsafe = driver_initialised(_own_maps())
        if unsafe is not None:
            skipped[name] = f"after importing it, {unsafe}; a fork would break CUDA"
            if server is not None:
                _state.update(
                    children=sorted(server.children), pending=server.pending, queue=server.queue
                )
            args = [sys.executable, "-m", "envbuilder.conformance.forkserver"]
            args += [_RESTART_FLAG, json.dumps(_state | {"skipped": skipped})]
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, args)
        loaded.append(name)
        if server is not None:
            server.loaded = list(loaded)
            server.announce()
            server.step(0, early_only=True)
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

    def step(self, timeout: float, *, early_only: bool = False) -> None:
        """Read the requests that arrive within ``timeout`` seconds, fork for them (only for
        those marked ``early`` while preloading) and report ended children."""
        ready, _, _ = select.select([self.requests_fd], [], [], timeout)
        self.reap()
        if ready:
            chunk = os.read(self.requests_fd, 65536).decode("utf-8")
            if not chunk:
                self.closed = True
            self.pending += chunk
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                if line.strip():
                    self.queue.append(json.loads(line))
        while self.queue and (self.queue[0].get("early") or not early_only):
            request = self.queue.pop(0)
            pid = os.fork()
            if pid == 0:
                _child([str(a) for a in request["argv"]], str(request["output"]), self.channel_fd)
            self.children.add(pid)
            self.send({"pid": pid, "preloaded": self.loaded})

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
    if not modules:
        server.announce()
    loaded = _preload(modules, skipped, server)
    server.announce()
    server.send(
        {
            "preloaded": loaded,
            "skipped": skipped,
            "import_s": round(time.time() - float(_state["started"]), 3),
            "threads": _thread_count(),
        }
    )
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
