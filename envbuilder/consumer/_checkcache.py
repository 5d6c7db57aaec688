"""What the doctor's GPU checks depend on, and their last results, kept between runs.

Run inside the checked environment (loaded by path from `_smoke` and `_extload`),
so it imports only the standard library. The attention and compile checks are
deterministic in what they depend on: the interpreter, the installed torch,
xformers, triton and CUDA libraries (each distribution's version and its
``RECORD``, which holds every file's sha256), the GPU and driver,
the settings torch reads (``TORCH*``/``XFORMERS*`` variables, the visible
devices) and the checks' own code. `check_key` names each of those; a record
written under the same key holds, and the doctor reuses its results instead of
compiling again. When the key moved, `changed` says which part did.

Files edited in place do not move the key: the doctor's file check (against
``RECORD``) fails for those instead.

The record and torch's own compile caches (``TORCHINDUCTOR_CACHE_DIR``,
``TRITON_CACHE_DIR``) live in a directory the doctor owns (`cache_dir`): beside
the environment (``<prefix>/.envbuilder-doctor``) where that is writable, else in
the user's cache directory.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA = "envbuilder.doctor-checks/1"
RECORD_NAME = "checks.json"
#: The checks a record holds, as `_smoke` names them in its report.
CHECKS = ("attention_sdpa", "attention_xformers", "compile_sdpa", "compile_xformers")
#: Distributions whose files the checks run: by exact name, or by prefix.
DEPENDS_ON = frozenset({"torch", "xformers", "triton", "pytorch-triton"})
DEPENDS_ON_PREFIXES = ("nvidia-", "cuda-")
#: Variables torch and xformers read; the doctor sets the cache ones itself.
SETTING_PREFIXES = ("TORCH", "XFORMERS", "CUDA_VISIBLE_DEVICES", "PYTORCH")
OWN_SETTINGS = frozenset(
    {
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
        "TORCHINDUCTOR_COMPILE_THREADS",
    }
)
_DIR_NAME = ".envbuilder-doctor"


def cache_dir(prefix: str, override: str | None = None) -> Path | None:
    """The doctor's directory for the environment at *prefix*; None when none is writable."""
    candidates = [Path(override)] if override else []
    if not override:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        digest = hashlib.sha256(prefix.encode()).hexdigest()[:12]
        candidates = [Path(prefix) / _DIR_NAME, Path(base) / "envbuilder" / "doctor" / digest]
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK | os.X_OK):
            return path
    return None


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _depends_on(name: str) -> bool:
    return name in DEPENDS_ON or name.startswith(DEPENDS_ON_PREFIXES)


def package_parts() -> dict[str, str]:
    """``package:<name>`` -> version and its ``RECORD``'s sha256, for every distribution
    the checks run (the first of a name on ``sys.path``, as imports see). ``RECORD``
    lists every file's sha256, so the same one means the same files where the file
    check passes."""
    parts: dict[str, str] = {}
    for dist in metadata.distributions():
        name = _normalise(dist.metadata["Name"] or "")
        key = f"package:{name}"
        if not _depends_on(name) or key in parts:
            continue
        record = dist.read_text("RECORD")
        stamp = hashlib.sha256(record.encode()).hexdigest()[:16] if record else "none"
        parts[key] = f"{dist.version}; RECORD {stamp}"
    return parts


def settings_part(environ: Mapping[str, str]) -> str:
    return ";".join(
        f"{k}={environ[k]}"
        for k in sorted(environ)
        if k.startswith(SETTING_PREFIXES) and k not in OWN_SETTINGS
    )


def gpu_facts() -> dict[str, Any]:
    """The driver and the first visible GPU, asked of the driver library (``libcuda``)
    without torch: name, compute capability, device count and the CUDA version the
    driver supports; ``error`` where it cannot answer."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"error": f"the NVIDIA driver library does not load: {e}"}
    rc = cuda.cuInit(0)
    if rc != 0:
        return {"error": f"cuInit failed (CUDA driver error {rc})"}
    value = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(value))
    facts: dict[str, Any] = {"driver_cuda": f"{value.value // 1000}.{value.value % 1000 // 10}"}
    release = _driver_release()
    if release:
        facts["driver"] = release
    cuda.cuDeviceGetCount(ctypes.byref(value))
    facts["devices"] = value.value
    if value.value < 1:
        return {**facts, "error": "the driver sees no CUDA device"}
    device = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return {**facts, "error": "the driver cannot open device 0"}
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)
    major, minor = ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # COMPUTE_CAPABILITY_MINOR
    facts["gpu"] = name.value.decode(errors="replace")
    facts["compute_capability"] = f"{major.value}.{minor.value}"
    return facts


def _driver_release() -> str | None:
    """The driver's release (``580.95.05``) from NVML, where it loads."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buffer = ctypes.create_string_buffer(96)
        ok = nvml.nvmlSystemGetDriverVersion(buffer, 96) == 0
        nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return buffer.value.decode(errors="replace") if ok else None


def check_key(
    checks_file: str, gpu: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, str]:
    """Everything the GPU checks depend on, one named part each (see the module);
    *environ* as the process inherited it (before torch or the doctor set anything)."""
    code = hashlib.sha256(Path(checks_file).read_bytes()).hexdigest()
    return {
        "python": f"{sys.version.split()[0]} at {sys.executable}",
        **package_parts(),
        "gpu": f"{gpu.get('gpu')} (compute capability {gpu.get('compute_capability')})",
        "driver": f"{gpu.get('driver', '?')} (CUDA {gpu.get('driver_cuda')})",
        "settings": settings_part(environ),
        "checks": code,
    }


def changed(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The parts of the key that differ, by name (``package:`` dropped), sorted."""
    names = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
    return sorted(name.removeprefix("package:") for name in names)


def read_record(directory: Path | None) -> dict[str, Any] | None:
    """The record in *directory*, or None where there is none that this schema reads."""
    if directory is None:
        return None
    try:
        record = json.loads((directory / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(record, dict)
        and record.get("schema") == SCHEMA
        and isinstance(record.get("key"), dict)
        and isinstance(record.get("results"), dict)
    )
    return record if ok else None


def reuse(
    record: Mapping[str, Any] | None, key: Mapping[str, str], *, recheck: bool
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The results of *record* that hold for *key* (None: run the checks), and what to say
    about it: ``{"reused", "at", "changed", "why"}``."""
    if recheck:
        return None, {"reused": False, "why": "asked to run the checks again"}
    if record is None:
        return None, {"reused": False, "why": "no earlier result here"}
    moved = changed(record["key"], key)
    if moved:
        return None, {
            "reused": False,
            "at": record.get("at"),
            "changed": moved,
            "why": f"changed since {record.get('at')}: {', '.join(moved)}",
        }
    results = {k: dict(v) for k, v in record["results"].items() if k in CHECKS}
    return results, {"reused": True, "at": record.get("at"), "changed": []}


def write_record(directory: Path | None, key: Mapping[str, str], results: Mapping[str, Any]) -> str:
    """Keep *results* under *key*; "" when written, else why not."""
    if directory is None:
        return "no writable directory for the doctor's records"
    record = {
        "schema": SCHEMA,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "key": dict(key),
        "results": {k: v for k, v in results.items() if k in CHECKS},
    }
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".checks-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        Path(tmp).replace(directory / RECORD_NAME)
    except OSError as e:
        return f"the record was not written: {e}"
    return ""
