"""One check group, run in its own process by the runner (never imported by it).

    python -m envbuilder.conformance.worker --group NAME --jsonl PATH --state PATH
        [--module MODULE] [--unit-parts N] [--device DEV] [--quick] [--checks PATTERN ...]
        [--shard I/N]
    python -m envbuilder.conformance.worker --runner-info [--device DEV]

The state file gets the group's plan first, then a line before each check
starts, so that the runner can name the check a crash or a hang happened in.
Results already in the JSONL stream are not run again (a restart after a
crash continues where the dead process stopped).

The group's module and how its checks split (``--module``, ``--unit-parts``)
come from the group registry (``groups.py``) unless the runner passes them.
``--shard I/N`` runs the I-th of N parts of the group (from 0), so that N
processes share it. Checks whose names agree in their first ``unit-parts``
dotted parts share state, such as one compilation, and stay in one part (a
*unit*); the units are dealt out by their measured costs (``costs.deal``:
longest first, each to the part with the least work so far), every process
computing the same deal. The plan line gives each planned
check's position in the whole group's plan (``positions``), so that the runner
can put the parts' results back in that order.

A direct check that fails (fail, error, timeout, invalid) is followed by its
workaround checks, each re-running its exact case with one workaround; they
are not in the plan (whether they run depends on the result), so their start
line carries their description for the runner.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuilder.conformance import _fault
from envbuilder.conformance._context import Context
from envbuilder.conformance._record import (
    FAILED,
    CheckResult,
    CheckSpec,
    Outcome,
    Skip,
    Status,
    append_jsonl,
    command_name,
    describe_error,
    matches,
    read_jsonl,
)
from envbuilder.conformance._wheel import installed_libraries
from envbuilder.conformance.costs import deal, known_costs, unit_of
from envbuilder.conformance.groups import group

__all__ = [
    "EXIT_RESTART",
    "execute",
    "main",
    "parse_shard",
    "run_planned",
    "shard",
]

#: the worker asks for a fresh process: the CUDA context is unusable after an error.
EXIT_RESTART = 75

#: fault injection for testing isolation: ENVBUILDER_CONFORMANCE_FAULT="<check name>=abort|hang|raise"
FAULT_VARIABLE = "ENVBUILDER_CONFORMANCE_FAULT"


def _inject_fault(name: str) -> None:
    wanted, _, kind = os.environ.get(FAULT_VARIABLE, "").partition("=")
    if wanted != name:
        return
    if kind == "abort":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        while True:
            time.sleep(1)
    elif kind == "raise":
        raise RuntimeError(f"fault injected by {FAULT_VARIABLE}")


def _missing(need: str, ctx: Context) -> str | None:
    """Why a requirement is not met, or None when it is."""
    if need == "cuda":
        if ctx.is_cuda:
            return None
        return "needs a CUDA device; this run uses the CPU (no CUDA device visible to torch)"
    if need in ("xformers", "diffusers"):
        if importlib.util.find_spec(need) is None:
            return f"{need} is not installed in this environment"
        return None
    if need == "gpus2":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return None if count >= 2 else f"needs two CUDA devices; {count} visible"
    raise ValueError(f"unknown requirement {need!r}")


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{describe_error(error)}{where}"[:2000]


def execute(spec: CheckSpec, ctx: Context) -> CheckResult:
    """Run one check, turning its outcome, a skip or an exception into a result."""
    start = time.monotonic()
    outcome: Outcome | None = None
    status: Status
    reason = ""
    numbers: dict[str, Any] = {}
    try:
        for need in sorted(spec.requires):
            why = _missing(need, ctx)
            if why is not None:
                raise Skip(why)
        _inject_fault(spec.name)
        outcome = spec.run()
    except Skip as e:
        status, reason = "skip", str(e)
    except Exception as e:  # a check that raises is recorded as an error, with its cause
        status, reason = "error", _describe(e)
        numbers = _fault.error_fault(e)
    if outcome is not None:
        status, reason, numbers = outcome.status, outcome.reason, dict(outcome.numbers)
    if status != "pass" and not reason:
        reason = f"{status} without a reason given"
    if status in ("fail", "invalid") and "cause" not in numbers:
        # the first problem names the cause; the check's group and implementation, what ran
        subject = " ".join(filter(None, (spec.group, spec.impl, spec.workaround)))
        numbers |= _fault.problem_fault(reason.split("; ")[0], subject)
    return CheckResult(
        group=spec.group,
        name=spec.name,
        status=status,
        reason=reason,
        gate=spec.gate,
        impl=spec.impl,
        workaround=spec.workaround,
        numbers=_clean(numbers),
        duration_s=time.monotonic() - start,
        uses=spec.uses,
        covers=spec.covers,
        via=spec.via,
    )


def _clean(numbers: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe numbers: NaN and infinities become strings, other objects their str()."""
    out: dict[str, Any] = {}
    for key, value in numbers.items():
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            out[key] = str(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = str(value)
    return out


def _cuda_error(result: CheckResult) -> bool:
    text = result.reason
    return result.status in FAILED and ("CUDA error" in text or "AcceleratorError" in text)


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (part I of N, from 0) as a pair; ValueError when it is not one."""
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: give I/N with 0 <= I < N, such as 0/4")
    return i, n


def shard(
    planned: Sequence[CheckSpec],
    unit_parts: int | None,
    index: int,
    count: int,
    costs: Mapping[str, float] | None = None,
) -> list[tuple[int, CheckSpec]]:
    """The checks of part ``index`` of ``count``, each with its position in ``planned``.

    Checks whose names agree in their first ``unit_parts`` dotted parts form a
    unit and stay together; the units are dealt out by ``costs`` (longest first,
    each to the part with the least work so far), without costs in plan order
    (unit k to part k mod ``count``). A group without ``unit_parts`` cannot be
    split: its one part is all of it."""
    if count == 1:
        return list(enumerate(planned))
    if unit_parts is None:
        raise ValueError("this group cannot be split into parts (no shard unit)")
    units: list[str] = []
    for spec in planned:
        unit = unit_of(spec.name, unit_parts)
        if unit not in units:
            units.append(unit)
    mine = set(deal(units, count, costs)[index])
    return [(p, s) for p, s in enumerate(planned) if unit_of(s.name, unit_parts) in mine]


def run_group(
    module_name: str,
    *,
    jsonl: Path,
    state: Path,
    device: str | None,
    quick: bool,
    patterns: Sequence[str],
    unit_parts: int | None = None,
    part: tuple[int, int] = (0, 1),
    costs: Mapping[str, float] | None = None,
) -> int:
    ctx = Context(device=device or _default_device(), quick=quick)
    module = importlib.import_module(module_name)
    planned: list[CheckSpec] = [
        s for s in module.specs(ctx) if matches(s.name, patterns) and (s.quick or not quick)
    ]
    if costs is None:
        costs = known_costs("quick" if quick else "full")
    mine = shard(planned, unit_parts, *part, costs=costs)
    append_jsonl(
        state,
        {
            "plan": [s.meta() for _, s in mine],
            "positions": [position for position, _ in mine],
            "device": ctx.device,
        },
    )
    return run_planned([s for _, s in mine], ctx, jsonl=jsonl, state=state)


def run_planned(planned: Sequence[CheckSpec], ctx: Context, *, jsonl: Path, state: Path) -> int:
    """Run the planned checks not yet in ``jsonl``, each failing one followed by its
    workaround checks; ``EXIT_RESTART`` after a CUDA error, else 0."""
    done: dict[str, Status] = {
        str(r.get("name")): r["status"] for r in read_jsonl(jsonl) if "status" in r
    }
    for spec in planned:
        if spec.name not in done:
            append_jsonl(state, {"start": spec.name})
            result = execute(spec, ctx)
            append_jsonl(jsonl, result.to_json())
            done[spec.name] = result.status
            if _cuda_error(result):
                return EXIT_RESTART  # a fresh process runs the workarounds
        if done[spec.name] not in FAILED:
            continue
        for workaround in spec.workarounds:
            if workaround.name in done:
                continue
            append_jsonl(state, {"start": workaround.name, "meta": workaround.meta()})
            result = execute(workaround, ctx)
            append_jsonl(jsonl, result.to_json())
            done[workaround.name] = result.status
            if _cuda_error(result):
                return EXIT_RESTART
    return 0


def _default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def runner_info(device: str | None) -> dict[str, Any]:
    """Facts about the machine and the environment for the results' ``runner``."""
    import platform
    import socket
    from importlib import metadata

    import torch

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    gpus: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                {
                    "index": index,
                    "name": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "memory_mib": int(props.total_memory // (1024 * 1024)),
                }
            )
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "xformers": version("xformers"),
        "xformers_libraries": installed_libraries("xformers"),
        "driver": driver_version() if gpus else None,
        "gpus": gpus,
        "device": device or _default_device(),
        **compilers(),
    }


def compilers() -> dict[str, str | None]:
    """The C compiler triton builds its launcher with (``$CC``, else gcc, else clang) and
    the C++ compiler inductor builds CPU kernels with (``$CXX``, else g++), each by its
    file name with the first line of its ``--version``; None where there is none."""
    import os
    import shutil
    import subprocess

    def first_line(command: str | None) -> str | None:
        if not command:
            return None
        try:
            done = subprocess.run(
                [command, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        lines = done.stdout.strip().splitlines()
        return lines[0] if lines else None

    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    cxx = os.environ.get("CXX") or shutil.which("g++")
    return {
        "cc": command_name(cc),
        "cc_version": first_line(cc),
        "cxx": command_name(cxx),
        "cxx_version": first_line(cxx),
    }


def driver_version() -> str | None:
    """The NVIDIA driver's version, from NVML when importable, else from nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            value = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:  # NVML absent or unusable: fall back to the command line tool
        pass
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def _read_costs(parser: argparse.ArgumentParser, path: Path | None) -> dict[str, float] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {str(unit): float(seconds) for unit, seconds in data.items()}
    except (OSError, ValueError, AttributeError, TypeError) as e:
        parser.error(f"--costs {str(path)!r}: not a JSON object of seconds per unit ({e})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envbuilder.conformance.worker")
    parser.add_argument("--group", help="the group's name (its module from the registry)")
    parser.add_argument("--module", help="the module whose specs() plans the group")
    parser.add_argument(
        "--unit-parts", type=int, help="dotted name parts that make a unit (default: registry)"
    )
    parser.add_argument("--jsonl", type=Path)
    parser.add_argument("--state", type=Path)
    parser.add_argument("--device")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--checks", action="append", default=[])
    parser.add_argument("--shard", default="0/1", help="run part I of N of the group (I/N)")
    parser.add_argument(
        "--costs", type=Path, help="JSON of seconds per unit to deal units by (default: the table)"
    )
    parser.add_argument("--runner-info", action="store_true")
    args = parser.parse_args(argv)
    if args.runner_info:
        print(json.dumps(runner_info(args.device)))
        return 0
    if args.group is None or args.jsonl is None or args.state is None:
        parser.error("--group, --jsonl and --state are required")
    try:
        part = parse_shard(args.shard)
    except ValueError as e:
        parser.error(str(e))
    module, unit_parts = args.module, args.unit_parts
    if module is None:
        try:
            spec = group(args.group)
        except KeyError as e:
            parser.error(str(e.args[0]))
        module, unit_parts = spec.module, spec.shard_unit_parts
    return run_group(
        module,
        jsonl=args.jsonl,
        state=args.state,
        device=args.device,
        quick=args.quick,
        patterns=args.checks,
        unit_parts=unit_parts,
        part=part,
        costs=_read_costs(parser, args.costs),
    )


if __name__ == "__main__":
    sys.exit(main())
