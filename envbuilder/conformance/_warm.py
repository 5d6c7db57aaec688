"""Work the fork server does once, beside its preloading, so that every child forked after
it finds the answer in memory instead of paying for it itself.

Inductor's C++ backend picks the CPU's vector instruction set the first time a process
compiles a CPU kernel (a compiled function that builds a tensor on the host, such as
xformers' block-diagonal mask from symbolic sequence lengths). For each instruction set
the CPU claims it compiles a probe with the compiler and loads it in a fresh Python (one
that imports torch, in torch 2.11), under a file lock: on an H200 host with a new cache
directory, 31 s of the 93 s first call of ``compile.xformers.blockdiag.dynamic.*``. The
answer is kept in memory only, per process, so each check process paid it again.

`CpuIsa` runs those probes in a process forked for them (threads, one per instruction
set), which sends back every probe's answer. The server then asks torch for its choice
with the probes answered from that record, in its main thread between forks, so that
torch's own caches hold the answer. The probes never run in the server itself: a child
forked while a thread of the server held a probe's file lock would inherit the lock's
descriptor and wait for it forever. A child forked before the answer arrives probes for
itself, as before. Nothing here touches CUDA.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["CpuIsa"]


class CpuIsa:
    """torch inductor's CPU vector ISA, probed in a forked process; `report` once `done`."""

    name = "cpu_vec_isa"

    def __init__(self) -> None:
        self._report: dict[str, Any] = {}
        self._fd: int | None = None
        self._pid = 0
        self._began = 0.0
        self._received = b""

    def start(self, closing: Sequence[int] = ()) -> None:
        """Fork the probing process; ``closing``: descriptors it must not keep open."""
        from torch._inductor import cpu_vec_isa  # noqa: F401 - both sides need it

        read, write = os.pipe()
        self._began = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _probe(write, closing)
        os.close(write)
        self._pid, self._fd = pid, read

    def done(self) -> bool:
        """Whether the answer is in (and applied); reads what has arrived, never waits."""
        if self._fd is None:
            return bool(self._report)
        while select.select([self._fd], [], [], 0)[0]:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                os.close(self._fd)
                self._fd = None
                with contextlib.suppress(ChildProcessError):  # the server may have reaped it
                    os.waitpid(self._pid, 0)
                self._report = self._apply()
                return True
            self._received += chunk
        return False

    def report(self) -> dict[str, Any]:
        return dict(self._report)

    def _apply(self) -> dict[str, Any]:
        try:
            sent = json.loads(self._received or b"{}")
        except ValueError:
            sent = {}
        if "answers" not in sent:
            return {"error": str(sent.get("error", "the probing process sent no answer"))}
        from torch._inductor import cpu_vec_isa

        recorded = {(isa, code): bool(ok) for isa, code, ok in sent["answers"]}
        missed: list[str] = []
        original = cpu_vec_isa.VecISA.check_build

        def replay(isa: Any, code: str) -> bool:
            if (str(isa), code) in recorded:
                return recorded[(str(isa), code)]
            missed.append(str(isa))
            return bool(original(isa, code))  # probed here: slow, but no thread holds a lock

        cpu_vec_isa.VecISA.check_build = replay  # type: ignore[method-assign,assignment]
        try:
            picked = cpu_vec_isa.pick_vec_isa()
        except Exception as e:  # the check processes probe for themselves
            return {"error": f"{type(e).__name__}: {e}"[:300]}
        finally:
            cpu_vec_isa.VecISA.check_build = original  # type: ignore[method-assign]
        return {
            "seconds": round(time.monotonic() - self._began, 3),
            "isa": str(picked) or "none",
            "probed": sorted({isa for isa, _, _ in sent["answers"]}),
            "probe_s": sent.get("seconds"),
            "probed_again": missed,
        }


def _probe(fd: int, closing: Sequence[int]) -> None:
    """In the forked process: run torch's probes (one thread per instruction set the CPU
    claims), write every probe's answer to ``fd`` as JSON, exit."""
    message: dict[str, Any]
    try:
        for other in closing:
            with contextlib.suppress(OSError):
                os.close(other)
        began = time.monotonic()
        from torch._inductor import cpu_vec_isa

        answers: list[list[Any]] = []
        original = cpu_vec_isa.VecISA.check_build

        def recording(isa: Any, code: str) -> bool:
            ok = bool(original(isa, code))
            answers.append([str(isa), code, ok])
            return ok

        cpu_vec_isa.VecISA.check_build = recording  # type: ignore[method-assign,assignment]
        probes = [
            threading.Thread(target=bool, args=(isa,), daemon=True) for isa in _claimed(cpu_vec_isa)
        ]
        for thread in probes:
            thread.start()
        for thread in probes:
            thread.join()
        cpu_vec_isa.pick_vec_isa()  # what the threads did not ask (another CPU family)
        message = {"answers": answers, "seconds": round(time.monotonic() - began, 3)}
    except BaseException as e:
        message = {"error": f"{type(e).__name__}: {e}"[:300]}
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(message).encode())
    finally:
        os._exit(0)


def _claimed(cpu_vec_isa: Any) -> list[Any]:
    """The instruction sets torch would probe on this CPU (those whose flags it claims)."""
    try:
        flags = cpu_vec_isa.x86_isa_checker()
    except Exception:  # not an x86 CPU: pick_vec_isa asks torch's own list
        return []
    return [
        isa
        for isa in cpu_vec_isa.supported_vec_isa_list
        if all(flag in flags for flag in str(isa).split())
    ]
