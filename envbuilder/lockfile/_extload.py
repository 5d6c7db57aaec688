"""The doctor's light probe: do torch's and xformers' libraries link, without importing torch?

Run by path in the environment's interpreter (standard library only). Where
no NVIDIA GPU is present there is no smoke test to run, and importing torch
only to read ``xformers._has_cpp_library`` costs most of a cold doctor run
(thousands of Python files). What decides that flag is whether xformers'
extension loads into a process that has torch's libraries: this loads torch's
own extension module's shared object (and through it libtorch, libc10 and the
CUDA libraries it needs) with every symbol bound at once (``RTLD_NOW``), then
xformers' ``_C`` the same way, so a missing library or an undefined symbol
(an extension built for another torch or CUDA) fails here as it would there.
Versions come from the distributions' metadata and ``torch/version.py``.

Prints one JSON object on its last line of stdout, with the keys `_smoke`
reports (``torch``, ``torch_cuda``, ``cuda_available``, ``xformers``) and
``light: true``; ``gpu_present: true`` where a GPU device node exists (the
doctor then runs the full probe instead).
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


def probe() -> dict[str, Any]:
    report: dict[str, Any] = {"light": True, "gpu_present": any(map(os.path.exists, GPU_NODES))}
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
