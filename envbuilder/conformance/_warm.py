"""Work the fork server does once, beside its preloading, so that every child forked after
it finds the answer in memory instead of paying for it itself.

Inductor's C++ backend picks the CPU's vector instruction set the first time a process
compiles a CPU kernel (a compiled function that builds a tensor on the host, such as
xformers' block-diagonal mask from symbolic sequence lengths). For each instruction set
the CPU claims it compiles a probe with the compiler and loads it in a fresh Python (one
that imports torch, in torch 2.11): on an H200 host with a new cache directory, 31-40 s
of the 93 s first call of ``compile.xformers.blockdiag.dynamic.*``. The answer is kept in
memory only, per process, so each check process paid it again.

`CpuIsa` runs those probes in threads of the fork server, one per instruction set (each
is a compiler and a Python process: the threads only wait), then asks torch for its list
so that torch's own caches hold the answer. A child forked before they end does what it
did before: probes for itself. Nothing here touches CUDA.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["CpuIsa"]


class CpuIsa:
    """torch inductor's CPU vector ISA, probed in the background; `report` once `done`."""

    name = "cpu_vec_isa"

    def __init__(self) -> None:
        self._report: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # imported here, in the server's main thread: a child forked while a thread holds
        # a module's import lock could never import that module
        from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401

        began = time.monotonic()
        candidates = _claimed(cpu_vec_isa)

        def probe_all() -> None:
            try:
                probes = [
                    threading.Thread(target=bool, args=(isa,), name=f"warm-{isa}", daemon=True)
                    for isa in candidates
                ]
                for thread in probes:
                    thread.start()
                for thread in probes:
                    thread.join()
                picked = cpu_vec_isa.pick_vec_isa()  # from the probes' cached answers
                self._report = {
                    "seconds": round(time.monotonic() - began, 3),
                    "isa": str(picked) or "none",
                    "probed": [str(isa) for isa in candidates],
                }
            except Exception as e:  # a check process that needs it probes for itself
                self._report = {"error": f"{type(e).__name__}: {e}"[:300]}

        self._thread = threading.Thread(target=probe_all, name="warm-cpu-isa", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def report(self) -> dict[str, Any]:
        return dict(self._report)


def _claimed(cpu_vec_isa: Any) -> list[Any]:
    """The instruction sets torch would probe on this CPU (those whose flags it claims)."""
    try:
        flags = cpu_vec_isa.x86_isa_checker()
    except Exception:  # not an x86 CPU: torch's own list decides, in the joining thread
        return []
    return [
        isa
        for isa in cpu_vec_isa.supported_vec_isa_list
        if all(flag in flags for flag in str(isa).split())
    ]
