"""Whether xformers' wheel runs with the chosen torch, by its build record.

The record (``xformers/cpp_lib.json``: torch, CUDA, arch list) is compared
with the combination's torch: another torch release is a note; another CUDA
minor is a note; a CPU torch is unsatisfiable; another CUDA major is
unsatisfiable unless the row sets ``add-cuda-runtime = true`` and the default
index has a runtime of the build's CUDA for the target, which is then added
to the closure.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from envbuilder.errors import EnvbuilderError
from envbuilder.model import ResolvedTorch, ResolvedXformers
from envbuilder.resolve._steps import (
    Failed,
    Found,
    Inputs,
    cuda_text,
    newest_for_cuda,
    unreadable,
    unsatisfiable,
)
from envbuilder.resolve.wheels import compare_cuda
from envbuilder.target import CudaTag, cuda_runtime_projects

__all__ = ["check_build"]

_UNNEEDED = "add-cuda-runtime = true: no runtime added: "


def check_build(inputs: Inputs, xformers: ResolvedXformers, torch: ResolvedTorch) -> Found | Failed:
    """What xformers' build record says about running it with ``torch``: notes, a CUDA
    runtime to add, or why it cannot run."""
    c = inputs.c
    notes = _torch_release_notes(xformers, torch)
    record = xformers.built_with
    built_v, torch_v = cuda_text(record.cuda), cuda_text(torch.cuda)
    match compare_cuda(record.cuda, torch.cuda):
        case "same":
            if c.add_cuda_runtime:
                notes.append(
                    f"{_UNNEEDED}xformers {xformers.version} was built with CUDA {built_v}, "
                    f"the CUDA of torch {torch.version}, whose runtime torch brings"
                )
        case "no-record":
            if c.add_cuda_runtime:
                notes.append(
                    f"{_UNNEEDED}xformers {xformers.version} records no build CUDA, "
                    "so no other runtime is known to be needed"
                )
        case "minor":
            notes.append(
                f"CUDA minor versions differ: xformers built with CUDA {built_v}, "
                f"torch built with CUDA {torch_v} (same major; minor-version compatible)"
            )
            if c.add_cuda_runtime:
                notes.append(
                    f"{_UNNEEDED}xformers {xformers.version} was built with CUDA {built_v}, "
                    f"the CUDA major of torch {torch.version} ({torch_v}), "
                    "whose runtime torch brings"
                )
        case "cpu-torch":
            return unsatisfiable(
                f"xformers {xformers.version} is a CUDA {built_v} build ({_built(xformers)}), "
                f"but torch {torch.version} is a CPU build: its extension cannot run",
                Found(notes=tuple(notes)),
            )
        case "major":
            return _other_major(inputs, xformers, torch, notes)
    return Found(notes=tuple(notes))


def _built(xformers: ResolvedXformers) -> str:
    """The torch xformers' record says it was built for, as messages name it."""
    record = xformers.built_with
    return f"torch {record.torch}" if record.torch else "an unrecorded torch"


def _torch_release_notes(xformers: ResolvedXformers, torch: ResolvedTorch) -> list[str]:
    """A note when xformers was built against another torch release (major.minor)."""
    record = xformers.built_with
    if not record.torch:
        return []
    try:
        built_release = Version(record.torch).release[:2]
        if built_release != Version(torch.version).release[:2]:
            return [
                f"xformers {xformers.version} was built against torch {record.torch}; "
                f"this combination runs it with torch {torch.version}"
            ]
    except InvalidVersion:
        pass
    return []


def _other_major(
    inputs: Inputs, xformers: ResolvedXformers, torch: ResolvedTorch, notes: list[str]
) -> Found | Failed:
    """xformers built with another CUDA major than torch's: the runtime it needs added, when
    the row allows it and the default index has one; else why it cannot run."""
    c = inputs.c
    record = xformers.built_with
    assert record.cuda is not None and torch.cuda is not None
    built_cuda = record.cuda
    major = built_cuda.major
    problem = (
        f"xformers {xformers.version} was built for {_built(xformers)} with CUDA "
        f"{cuda_text(built_cuda)}, but torch {torch.version} is built with CUDA "
        f"{cuda_text(torch.cuda)}: xformers' C++/CUDA extension needs libcudart.so.{major}, "
        "which this torch does not bring"
    )
    try:
        runtime = _cuda_runtime(inputs, built_cuda)
    except (EnvbuilderError, ValueError) as e:
        return unreadable(e, Found(notes=tuple(notes)))
    if runtime is None:
        return unsatisfiable(
            f"{problem}; no CUDA {built_cuda.version} runtime wheel for {inputs.target.describe()} "
            f"on the default index (looked for "
            f"{', '.join(cuda_runtime_projects(major))}), so add-cuda-runtime "
            "cannot add one",
            Found(notes=tuple(notes)),
        )
    if not c.add_cuda_runtime:
        return unsatisfiable(
            f"{problem}; set add-cuda-runtime = true to add {runtime}",
            Found(notes=tuple(notes)),
        )
    notes = [*notes, f"{problem}; added {runtime} (add-cuda-runtime = true)"]
    if inputs.target.family == "windows":
        notes.append(
            f"on Windows the extension finds {runtime}'s DLLs only where PATH (or "
            "os.add_dll_directory) names its nvidia/cuda_runtime/bin directory"
        )
    return Found(notes=tuple(notes), extra_runtime=(runtime,))


def _cuda_runtime(inputs: Inputs, cuda: CudaTag) -> str | None:
    """The newest CUDA runtime wheel of the build's major.minor for the target on the
    default index, from the first of `cuda_runtime_projects` that has one."""
    for project in cuda_runtime_projects(cuda.major):
        best = newest_for_cuda(inputs, project, cuda)
        if best is not None:
            return f"{project}=={best}"
    return None
