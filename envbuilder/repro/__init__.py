"""``envbuilder repro`` and ``envbuilder report``: a failing check's cause as a minimal
script, and as an issue draft for the project at fault.

`records` reads the check records (from the lockfile by default, from results files
for maintainers), `causes` says which known cause a failed check has, `scripts`
writes that cause's minimal standalone script, `report` the Markdown draft around it.
A check whose error the suite's own code raised is refused (`refuse_suite_error`):
it is a bug of the suite, with nothing to send upstream.
"""

from __future__ import annotations

from envbuilder.errors import InputError
from envbuilder.repro.causes import KNOWN, KnownCause, by_key, cause_of, sharing
from envbuilder.repro.records import (
    Recorded,
    RecordedRun,
    choose,
    from_lockfile,
    of_combination,
    results_in,
)
from envbuilder.repro.report import draft
from envbuilder.repro.scripts import code_lines, default_filename, render

__all__ = [
    "KNOWN",
    "KnownCause",
    "NoReproducer",
    "Recorded",
    "RecordedRun",
    "SuiteError",
    "by_key",
    "cause_of",
    "choose",
    "code_lines",
    "default_filename",
    "draft",
    "from_lockfile",
    "known_cause",
    "of_combination",
    "refuse_suite_error",
    "render",
    "results_in",
    "sharing",
]


class NoReproducer(InputError):
    """No minimal script shows this check's failure."""


class SuiteError(InputError):
    """The check's error was raised in the suite's own code: nothing to reproduce upstream."""


def refuse_suite_error(check: Recorded) -> None:
    if check.suite_error:
        where = check.numbers.get("fault_evidence") or check.reason
        raise SuiteError(
            f"{check.name} errored in envbuilder's own conformance code ({where}): that is a bug"
            " of the suite, not of torch, xformers or diffusers, and no verdict counts it, so"
            " there is nothing to reproduce or report upstream; report it to envbuilder"
        )


def known_cause(check: Recorded, *, by_name: bool = False) -> KnownCause:
    """The known cause of ``check``, or `NoReproducer` naming the causes there are."""
    refuse_suite_error(check)
    cause = cause_of(check, by_name=by_name)
    if cause is None:
        known = "; ".join(f"{c.key} ({', '.join(c.names)})" for c in KNOWN)
        raise NoReproducer(
            f"no minimal reproducer for {check.name}'s cause ({check.cause!r}); envbuilder"
            f" repro writes one for: {known}"
        )
    return cause
