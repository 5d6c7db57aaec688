"""The conformance suite: does a Python/CUDA/torch/xformers combination actually work?

It runs *inside* the environment under test (a container image or the current
interpreter) and depends on nothing but the standard library, torch and,
where present, xformers and diffusers: never on the rest of envbuilder.

    python -m envbuilder.conformance --out results.json [--checks PATTERN]
        [--device cuda:N] [--quick] [--combination ID] [--lock-sha256 HEX]

Each check group runs in its own subprocess with a time limit; every check's
result is appended to ``<out>.jsonl`` as it finishes, and ``<out>`` is written
atomically at the end in the ``envbuilder.results/3`` shape (docs/contracts.md).
"""

from __future__ import annotations

from envbuilder.conformance._record import RESULTS_SCHEMA
from envbuilder.conformance.groups import builtin_groups

__all__ = ["FULL_ONLY_GROUPS", "GROUPS", "RESULTS_SCHEMA", "SUITE_VERSION"]

SUITE_VERSION = "3.0.0"

#: the suite's check groups, in the order their results are listed (``groups.py`` holds
#: how each runs; a group registered later comes after these).
GROUPS: tuple[str, ...] = tuple(g.name for g in builtin_groups())

#: groups with no ``--quick`` checks: a quick run does not start their process at all
#: (starting one and importing torch costs seconds for nothing). None today: --quick
#: keeps the model's training step.
FULL_ONLY_GROUPS: frozenset[str] = frozenset(g.name for g in builtin_groups() if g.full_only)
