"""Whether a results file's environment is the one its combination names.

A results file says which combination and lock it ran on, and separately
what it found installed (``runner``, the ``environment.versions`` check). A
file whose findings contradict its claim is not evidence for that
combination, whoever wrote it: another combination's run relabelled, a run
on another torch than the lock's, a CPU-only machine claiming an H200. Each
rule below names the contradiction it finds; `lock` rejects the file with
them.

=====================================  ==============================================
fact the run recorded                  must agree with
=====================================  ==============================================
``runner.python`` (X.Y.Z)              the combination's Python X.Y
``runner.torch``                       torch's version (its public part, and the
                                         local label when the lock's torch has one)
``runner.torch_cuda``                  torch's CUDA (major.minor); none for a CPU
                                         torch
``runner.xformers``                    the combination's xformers version; none
                                         when it has no xformers (an unsatisfiable
                                         one: the versions it asked for)
``runner.platform``                    the target's machine (``x86_64``, ``aarch64``)
                                         where it names one, and the target's
                                         operating system (Linux, Windows, macOS)
                                         where it names one
``runner.gpus``                        each GPU's compute capability with its
                                         name's (for the GPUs envbuilder knows);
                                         any GPU needs a CUDA torch and a driver
``environment.versions``               on the current lock: the locked versions
                                         of the CUDA chain (torch, triton,
                                         xformers, the ``nvidia-*``/``cuda-*``
                                         runtime packages)
``runner.xformers_libraries``          on the current lock of a source build with a
                                         build record: the sha256 of each compiled
                                         library of the recorded wheel (its
                                         ``RECORD``); a run without the fact is
                                         not compared
=====================================  ==============================================

Packages outside the CUDA chain are not compared: a run made in place on a
host may hold the host's numpy, and that does not change what torch and
xformers do. A run carried from a previous lockfile (`run_problems`) is held
to the same rules, over the runner and checks it keeps, and is filed under
its runner's first GPU (``gpu``, ``compute_capability``), as a results file's
run is. Standard library and envbuilder's records only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from envbuilder.gpus import GPU_COMPUTE_CAPABILITY
from envbuilder.lockfile.model import Run
from envbuilder.model import ResolvedCombination
from envbuilder.target import ARCHES, platform_arch, platform_family

__all__ = ["claim_problems", "cuda_chain", "run_problems"]

_SQUASH = re.compile(r"[^0-9a-z]")
#: the GPU table's names, longest first, so that "GH200" is found before "H200"
_KNOWN = sorted(GPU_COMPUTE_CAPABILITY, key=len, reverse=True)
_CHAIN = re.compile(r"^(torch|triton|pytorch-triton|xformers|nvidia-.*|cuda-.*)$")


def cuda_chain(name: str) -> bool:
    """Whether a (normalised) project name is part of what torch and xformers run on."""
    return bool(_CHAIN.match(name))


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _major_minor(version: object) -> str | None:
    if not isinstance(version, str):
        return None
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


#: the operating system ``platform.platform()`` starts with, as targets' families name it
_SYSTEMS = {"Linux": "linux", "Windows": "windows", "macOS": "macos", "Darwin": "macos"}


def _family(platform: str) -> str | None:
    """The operating system a target's platform tag names (musllinux is Linux)."""
    try:
        family = platform_family(platform)
    except ValueError:
        return None
    return "linux" if family == "musllinux" else family


def _named_machine(platform: str) -> str | None:
    """The machine a runner's ``platform.platform()`` names (``…-x86_64-with-glibc2.39``);
    None where it names none (a bare ``Linux`` says nothing against the target)."""
    for machine in ("x86_64", "aarch64", "arm64", "ppc64le", "s390x"):
        if machine in platform:
            return "aarch64" if machine == "arm64" else machine
    return None


def _gpu_problems(runner: Mapping[str, Any]) -> list[str]:
    gpus = runner.get("gpus") or []
    problems: list[str] = []
    for gpu in gpus:
        if not isinstance(gpu, Mapping):
            problems.append(f"runner.gpus holds {gpu!r}, not a GPU record")
            continue
        name = str(gpu.get("name", ""))
        squashed = _SQUASH.sub("", name.lower())
        known = next((k for k in _KNOWN if _SQUASH.sub("", k.lower()) in squashed), None)
        cc = gpu.get("compute_capability")
        if known is not None and cc != GPU_COMPUTE_CAPABILITY[known]:
            problems.append(
                f"GPU {name!r} with compute capability {cc!r}; a {known} is "
                f"{GPU_COMPUTE_CAPABILITY[known]}"
            )
    if gpus and not runner.get("torch_cuda"):
        problems.append(f"{len(gpus)} GPU(s) listed, but torch has no CUDA (torch_cuda is null)")
    if gpus and not runner.get("driver"):
        problems.append(f"{len(gpus)} GPU(s) listed, but no NVIDIA driver (driver is null)")
    return problems


def _build_problems(runner: Mapping[str, Any], built: Mapping[str, str] | None) -> list[str]:
    """Whether the run's xformers libraries are those of the recorded build's wheel."""
    found = runner.get("xformers_libraries")
    if not built or found is None:
        return []
    if not isinstance(found, Mapping):
        return [f"runner.xformers_libraries holds {found!r}, not an object"]
    problems: list[str] = []
    for path, sha256 in sorted(built.items()):
        have = found.get(path)
        if have != sha256:
            problems.append(
                f"xformers' {path} "
                + (f"has sha256 {str(have)[:12]}…" if have else "is not installed")
                + f", not the built wheel's {sha256[:12]}… (its build record): the run "
                "measured another build; rebuild the record or run again with the recorded wheel"
            )
    return problems


def _recorded_versions(checks: object) -> Mapping[str, Any]:
    if not isinstance(checks, list):
        return {}
    for check in checks:
        if isinstance(check, Mapping) and check.get("name") == "environment.versions":
            numbers = check.get("numbers")
            return numbers if isinstance(numbers, Mapping) else {}
    return {}


def claim_problems(
    data: Mapping[str, Any],
    combo: ResolvedCombination,
    *,
    locked: Mapping[str, str] | None = None,
    built: Mapping[str, str] | None = None,
) -> list[str]:
    """What in a results file's findings contradicts its combination (the module's table).

    ``locked`` maps the current lock's packages (normalised names) to their versions; give
    it only for a run on the current lock. ``built`` maps the compiled libraries of a source
    build's recorded wheel to their sha256, likewise. An empty list: nothing contradicts."""
    runner = data.get("runner")
    if not isinstance(runner, Mapping):
        return ["runner is not an object"]
    problems: list[str] = []
    python = runner.get("python")
    if _major_minor(python) != combo.python:
        problems.append(f"Python {python}, not {combo.python}")
    torch = runner.get("torch")
    if combo.torch is not None:
        want = combo.torch.version
        if not isinstance(torch, str) or (
            _public(torch) != _public(want) or ("+" in want and torch != want)
        ):
            problems.append(f"torch {torch}, not {want}")
        cuda = runner.get("torch_cuda")
        if combo.torch.cuda is None and cuda is not None:
            problems.append(f"torch built for CUDA {cuda}, but the lock's torch is a CPU build")
        elif combo.torch.cuda is not None and _major_minor(cuda) != combo.torch.cuda.version:
            problems.append(f"torch's CUDA {cuda}, not {combo.torch.cuda.version}")
    elif (
        combo.requested is not None  # unsatisfiable: the versions it asked for are the run's
        and isinstance(torch, str)
        and _public(torch) != _public(combo.requested.torch)
    ):
        problems.append(f"torch {torch}, not {combo.requested.torch}")
    xformers = runner.get("xformers")
    wanted = (
        combo.xformers.version
        if combo.xformers is not None
        else combo.requested.xformers
        if combo.requested is not None
        else None
    )
    if wanted is None and xformers is not None:
        problems.append(f"xformers {xformers} installed, but the combination has none")
    elif wanted is not None and xformers is not None and _public(str(xformers)) != _public(wanted):
        problems.append(f"xformers {xformers}, not {wanted}")
    platform = str(runner.get("platform", ""))
    machine = platform_arch(combo.platform)
    ran_on = _named_machine(platform)
    if machine in ARCHES and ran_on is not None and ran_on != machine:
        problems.append(f"platform {platform!r}, not a {machine} machine ({combo.platform})")
    system = _SYSTEMS.get(platform.split("-", 1)[0])
    family = _family(combo.platform)
    if system is not None and family is not None and system != family:
        problems.append(f"platform {platform!r}, not a {family} machine ({combo.platform})")
    problems += _gpu_problems(runner)
    problems += _build_problems(runner, built)
    if locked:
        recorded = _recorded_versions(data.get("checks"))
        for key, version in sorted(recorded.items()):
            name = key.replace("_", "-").lower()
            if not cuda_chain(name) or name not in locked or not isinstance(version, str):
                continue
            if _public(version) != _public(locked[name]):
                problems.append(f"{name} {version} installed, the lock has {locked[name]}")
    return problems


def _filed_under(run: Run) -> list[str]:
    """Whether *run* is filed under the GPU its runner lists first (``cpu``: none)."""
    gpus = run.runner.get("gpus") or []
    first = gpus[0] if isinstance(gpus, list) and gpus else None
    if first is not None and not isinstance(first, Mapping):
        return []  # `claim_problems` names it
    name = first.get("name") if first is not None else "cpu"
    cc = first.get("compute_capability") if first is not None else None
    if (run.gpu, run.compute_capability) == (name, cc):
        return []
    return [
        f"filed under GPU {run.gpu!r} with compute capability {run.compute_capability!r}, "
        f"but its runner's first GPU is {name!r} with {cc!r}"
    ]


def run_problems(
    run: Run,
    combo: ResolvedCombination,
    *,
    locked: Mapping[str, str] | None = None,
    built: Mapping[str, str] | None = None,
) -> list[str]:
    """What contradicts *combo* in a run a lockfile carries: `claim_problems` over the
    runner and checks it keeps, and the GPU it is filed under against its runner's."""
    recorded = {
        "runner": run.runner,
        "checks": [{"name": c.name, "numbers": c.numbers} for c in run.checks],
    }
    return _filed_under(run) + claim_problems(recorded, combo, locked=locked, built=built)
