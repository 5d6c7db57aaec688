"""The doctor's light probe: do torch's and xformers' libraries link, without importing torch?

Run by path in the environment's interpreter (standard library only). Where
no NVIDIA GPU is present there is no smoke test to run, and importing torch
only to read ``xformers._has_cpp_library`` costs most of a cold doctor run
(thousands of Python files). What decides that flag is whether xformers'
extension loads into a process that has torch's libraries: this loads torch's
own extension module's shared object (and through it libtorch, libc10 and the
CUDA libraries it needs) with every symbol bound at once (``RTLD_NOW``), the
CUDA runtime ``import torch`` preloads from the ``nvidia-*`` wheels
(`cuda_runtime_candidates`), then xformers' ``_C`` the same way, so a missing library or an undefined symbol
(an extension built for another torch or CUDA) fails here as it would there.
Versions come from the distributions' metadata and ``torch/version.py``.

Prints one JSON object on its last line of stdout, with the keys `_smoke`
reports (``torch``, ``torch_cuda``, ``cuda_available``, ``xformers``) and
``light: true``; ``gpu_present: true`` where a GPU device node exists (the
doctor then runs the full probe instead).

``--fast [--cache DIR]`` (``envbuilder doctor --fast``, a start-up check that
stays within the import's own time) asks the driver for the GPU instead
(`_checkcache.gpu_facts`: ``libcuda``, no torch) and reports the GPU checks'
last results where nothing they depend on changed since (``from``: when they
ran), else ``cache`` says what changed.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

#: Device nodes of the NVIDIA driver: where one exists the full probe's smoke test can run.
GPU_NODES = ("/dev/nvidia0", "/dev/nvidiactl")


def _package_dir(name: str) -> Path | None:
    """The package's directory, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _literals(path: Path) -> dict[str, Any]:
    """The module-level constant assignments of a Python file, read without running it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: dict[str, Any] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found


def _load(path: Path) -> str | None:
    """Load a shared object with every symbol bound now, into the global scope (as
    ``torch.ops.load_library`` does); None when it loads, else the loader's message."""
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        return str(e)
    return None


def _checkcache() -> Any:
    """`_checkcache`, loaded by path from beside this file (envbuilder need not be installed)."""
    path = Path(__file__).with_name("_checkcache.py")
    spec = importlib.util.spec_from_file_location("_envbuilder_doctor_checkcache", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded_checks(report: dict[str, Any], override: str | None) -> None:
    """``--fast``: the GPU from its driver, and the GPU checks' last results where they hold."""
    cc = _checkcache()
    gpu = cc.gpu_facts()
    if "error" in gpu:
        report["gpu_error"] = gpu["error"]
        return
    report["cuda_available"] = True
    report.update({k: gpu[k] for k in ("gpu", "compute_capability", "driver") if k in gpu})
    cache = cc.cache_dir(sys.prefix, override)
    key = cc.check_key(str(Path(__file__).with_name("_smoke.py")), gpu, dict(os.environ))
    recorded, report["cache"] = cc.reuse(cc.read_record(cache), key, recheck=False)
    report["cache"]["dir"] = None if cache is None else str(cache)
    for name, outcome in (recorded or {}).items():
        report[name] = {**outcome, "from": report["cache"]["at"]}


def cuda_runtime_candidates(paths: list[str], torch_cuda: str | None) -> list[Path]:
    """The CUDA runtimes ``import torch`` preloads from the ``nvidia-*`` wheels, in its
    order (``torch._preload_cuda_deps``): ``nvidia/cuda_runtime/lib``, then
    ``nvidia/cu<major>/lib``, then ``cuda_runtime/lib``, under each ``sys.path`` entry."""
    found: list[Path] = []
    pattern = "libcudart.so.*[0-9]"
    for entry in paths:
        base = Path(entry or ".")
        folders = [base / "nvidia" / "cuda_runtime" / "lib"]
        if torch_cuda:
            folders.append(base / "nvidia" / f"cu{torch_cuda.split('.')[0]}" / "lib")
        folders.append(base / "cuda_runtime" / "lib")
        for folder in folders:
            found += sorted(folder.glob(pattern))
        if found:
            return found[:1]
    return found


def gpu_present() -> bool:
    """Whether an NVIDIA GPU's device node exists here (`GPU_NODES`)."""
    return any(map(os.path.exists, GPU_NODES))


def probe(argv: list[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    fast = "--fast" in args
    override = args[args.index("--cache") + 1] if "--cache" in args else None
    report = _light()
    if fast:
        report["fast"] = True
        if report.get("gpu_present") and report.get("torch") is not None:
            recorded_checks(report, override)
    return report


def _light() -> dict[str, Any]:
    report: dict[str, Any] = {"light": True, "gpu_present": gpu_present()}
    torch_dir = _package_dir("torch")
    if torch_dir is None:
        return {**report, "torch": None, "torch_error": "no module named 'torch'"}
    try:
        facts = _literals(torch_dir / "version.py")
    except (OSError, SyntaxError, ValueError) as e:
        return {**report, "torch": None, "torch_error": f"torch/version.py unreadable: {e}"}
    report["torch"] = facts.get("__version__") or _version("torch")
    report["torch_cuda"] = facts.get("cuda")
    report["cuda_available"] = False
    torch_ext = sorted(torch_dir.glob("_C.*.so"))
    problem = _load(torch_ext[0]) if torch_ext else "torch has no _C extension module"
    if problem is not None:
        return {**report, "torch": None, "torch_error": f"torch's libraries do not load: {problem}"}
    xformers_dir = _package_dir("xformers")
    if xformers_dir is None:
        report["xformers"] = None
        return report
    # as ``import torch`` does before anything imports xformers: a ``-cudart`` environment's
    # extension needs the runtime that only a ``nvidia-cuda-runtime`` wheel brings
    for runtime in cuda_runtime_candidates(sys.path, report["torch_cuda"]):
        _load(runtime)
    extensions = sorted(xformers_dir.glob("_C*.so"))
    failures = [p for p in (_load(path) for path in extensions) if p is not None]
    report["xformers"] = {
        "version": _version("xformers"),
        "extension_loaded": bool(extensions) and not failures,
        "warnings": failures
        or ([] if extensions else ["xformers has no C++/CUDA extension (_C*.so)"]),
    }
    return report


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.stdout.flush()
