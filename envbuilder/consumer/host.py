"""The machine a query is for: Python, CPU architecture, GPUs and the NVIDIA driver.

`Host` is a plain record; `detect_host` is the only function here that looks at
the machine (``query --here``). It asks NVML through ``pynvml`` when that is
importable and answers, else ``nvidia-smi --query-gpu=...``; a machine with
neither has no GPU, and the record says why. Everything else is pure.
"""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envbuilder.target import platform_arch

__all__ = [
    "NVIDIA_SMI_QUERY",
    "Gpu",
    "Host",
    "detect_host",
    "host_family",
    "parse_nvidia_smi",
]

log = logging.getLogger(__name__)

#: Architectures as wheel platform tags end in them, and the other names machines use.

#: The fields `parse_nvidia_smi` reads, in this order.
NVIDIA_SMI_QUERY = ("name", "compute_cap", "driver_version")


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    compute_capability: str | None  # "9.0"; None when the tool could not say


@dataclass(frozen=True, kw_only=True)
class Host:
    python: str  # "3.12"; "" when no interpreter was found
    arch: str  # "x86_64", "aarch64"
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    source: str = ""  # where the GPU facts came from: "NVML", "nvidia-smi"
    note: str = ""  # why there are no GPU facts
    #: the operating system as targets name it (`envbuilder.target.PlatformFamily`);
    #: "" when unknown (then rows for every platform are candidates)
    os: str = ""

    def describe(self) -> str:
        text = f"{f'Python {self.python}' if self.python else 'no Python found'}, {self.arch}"
        if self.gpus:
            names = ", ".join(
                f"{g.name} (sm_{(g.compute_capability or '?').replace('.', '')})" for g in self.gpus
            )
            text += f", {names}, driver {self.driver or 'unknown'} (from {self.source})"
        else:
            text += f", no NVIDIA GPU ({self.note or 'none found'})"
        return text


def host_family(system: str | None = None) -> str:
    """The operating system of *system* (default: this machine's ``sys.platform``) as
    targets name it: ``windows``, ``macos``, ``linux``; "" for any other."""
    system = sys.platform if system is None else system
    if system in ("win32", "cygwin"):
        return "windows"
    if system == "darwin":
        return "macos"
    return "linux" if system.startswith("linux") else ""


def parse_nvidia_smi(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs and driver in ``nvidia-smi --query-gpu=name,compute_cap,driver_version
    --format=csv,noheader`` output (one line per GPU)."""
    gpus: list[Gpu] = []
    drivers: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(NVIDIA_SMI_QUERY):
            raise ValueError(f"unexpected nvidia-smi line {line!r}")
        name, cc, driver = fields
        known = cc if cc and cc[0].isdigit() else None  # "[N/A]" on old drivers
        gpus.append(Gpu(name=name, compute_capability=known))
        if driver and driver[0].isdigit():
            drivers.append(driver)
    return tuple(gpus), (drivers[0] if drivers else None)


def _nvml() -> tuple[tuple[Gpu, ...], str | None] | None:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    nvml: Any = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        log.debug("NVML did not start: %s", e)
        return None
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Gpu(
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    compute_capability=f"{major}.{minor}",
                )
            )
        return tuple(gpus), driver.decode() if isinstance(driver, bytes) else str(driver)
    except nvml.NVMLError as e:
        log.debug("NVML query failed: %s", e)
        return None
    finally:
        nvml.nvmlShutdown()


def detect_host(
    *,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
    nvml: Callable[[], tuple[tuple[Gpu, ...], str | None] | None] = _nvml,
    python: str | None = None,
) -> Host:
    """This machine: *python* (the chosen interpreter's version; default: the running one),
    ``platform.machine()``, and the GPUs by NVML or ``nvidia-smi``."""
    python = f"{sys.version_info[0]}.{sys.version_info[1]}" if python is None else python
    arch = platform_arch(platform.machine().lower() or "unknown")
    system = host_family()
    found = nvml()
    if found is not None and found[0]:
        return Host(
            python=python,
            arch=arch,
            os=system,
            gpus=found[0],
            driver=found[1],
            source="NVML",
        )
    smi = which("nvidia-smi")
    if smi is None:
        return Host(python=python, arch=arch, os=system, note="no NVML and no nvidia-smi on PATH")
    command: Sequence[str] = [
        smi,
        f"--query-gpu={','.join(NVIDIA_SMI_QUERY)}",
        "--format=csv,noheader",
    ]
    try:
        proc = run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Host(python=python, arch=arch, os=system, note=f"nvidia-smi did not run ({e})")
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        return Host(
            python=python,
            arch=arch,
            os=system,
            note=f"nvidia-smi exited with status {proc.returncode}"
            + (f": {why[-1]}" if why else ""),
        )
    try:
        gpus, driver = parse_nvidia_smi(proc.stdout)
    except ValueError as e:
        return Host(python=python, arch=arch, os=system, note=f"nvidia-smi: {e}")
    if not gpus:
        return Host(python=python, arch=arch, os=system, note="nvidia-smi lists no GPU")
    return Host(python=python, arch=arch, os=system, gpus=gpus, driver=driver, source="nvidia-smi")
