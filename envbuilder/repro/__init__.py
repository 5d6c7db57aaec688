"""``envbuilder repro``: a standalone script that rebuilds a failing conformance check.

`results.choose` finds the check in a results file, `cases.plan` rebuilds its case
from its name and the suite's definitions, `script.render` writes the script.
"""

from __future__ import annotations

from envbuilder.repro.cases import SUPPORTED, ReproCase, UnsupportedCheck, infer_profile, plan
from envbuilder.repro.results import Recorded, ResultsFile, choose, load, results_in
from envbuilder.repro.script import Origin, default_filename, render

__all__ = [
    "SUPPORTED",
    "Origin",
    "Recorded",
    "ReproCase",
    "ResultsFile",
    "UnsupportedCheck",
    "choose",
    "default_filename",
    "generate",
    "infer_profile",
    "load",
    "plan",
    "render",
    "results_in",
]


def origin_of(recorded: Recorded) -> Origin:
    """The facts a script's header names, from the recorded check and its run."""
    data = recorded.results.data
    return Origin(
        check=recorded.name,
        status=recorded.status,
        reason=recorded.reason,
        results_path=str(recorded.results.path),
        combination=data.get("combination"),
        lock_sha256=data.get("lock_sha256"),
        suite_version=data.get("suite_version"),
        finished=recorded.results.finished or None,
        runner=recorded.runner,
        numbers=recorded.numbers,
        fault_component=recorded.fact("fault_component"),
        fault_op=recorded.fact("fault_op"),
        cause=recorded.fact("cause"),
    )


def generate(recorded: Recorded, *, filename: str | None = None) -> tuple[ReproCase, str]:
    """The case ``recorded`` ran and the script that rebuilds it."""
    profile = infer_profile(
        recorded.name,
        recorded.numbers,
        cuda=recorded.cuda,
        file_says_quick=recorded.quick_file,
    )
    case = plan(recorded.name, recorded.numbers, profile)
    return case, render(case, origin_of(recorded), filename=filename)
