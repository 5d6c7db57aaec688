"""The published compatibility lockfile: ``compat.lock.json`` at the repository root.

Decisions (also in docs/lockfile.md, "The compatibility lockfile"):

- Name ``compat.lock.json``; ``schema = "envbuilder.compat/4"``. The major
  number changes only when a reader of the previous one would misread the
  file (/2: per-use verdicts and the check status ``invalid``, which a /1
  reader would count as neither passed nor failed; /3: ``retired``, run
  dates, ``last_verified`` on every entry with runs, the verdict
  ``xformers-unusable``, which a /2 reader cannot rank, and each verdict's
  ``options``; /4: each check's ``via``, each verdict's ``advisories`` and
  ``suite_errors``, workaround tiers and breaks per call and per step). Readers read
  /4, /3 and /2 (`model.READABLE_COMPAT_SCHEMAS`; older checks take ``via`` from their
  names, every verdict is made again on read) and refuse
  any other schema string (exit 2): regenerate a /1 file, upgrade for a newer.
- JSON Schema: ``envbuilder/schemas/compat.schema.json`` (``publish`` copies it).
- Canonical JSON (`canonical`): sorted keys, fixed indent and separators,
  UTF-8, trailing newline, no timestamps of its own (only those in the
  results) — the same inputs give byte-identical output.
- ``content_sha256`` = sha256 of the canonical document without that key;
  every reader (`read.load_lockfile`) recomputes it and refuses a mismatch.
- Every file is written atomically (temporary file + ``os.replace``).
- Verdicts: per use (inference, inference-compiled, training,
  training-compiled) and overall the worst; the tables in `verdicts`. A
  workaround keeps xformers (``dynamo-disable``) or replaces it (the SDPA
  ones): a use passed only by replacing it is ``xformers-unusable``, and the
  readers point to the torch-alone combination (`query.replacement`).
- What a verdict tells users (`advice`, shared by ``query``, the site and
  ``compat.md``): one line of at most 120 characters —
  the verdict, the failing gate checks' count, the age, the one action — and
  the failing checks grouped by cause with an ``envbuilder repro`` command.
  A verdict's date is derived, never stored: the newest ``finished`` of the
  runs counted for it (of the queried compute capability), else the stale
  evidence's ``last_verified`` date.
- Results on an older lock of a combination are stale evidence (`results`):
  kept under ``stale_runs``, never counted; the current lock stays
  ``unverified`` until it has runs, its reason saying when it was last verified.
- What a host needs: each combination's ``arch`` (from its platform tag),
  ``cuda_release`` and ``minimum_driver``; the lockfile's ``drivers`` table
  with its source (`drivers`). `query.answer` rejects combinations for another
  Python, architecture or an older driver, each with its reasons; `host`
  detects this machine for ``query --here``.
- Evidence accumulates (`merge`): ``lock --previous`` carries the last
  published lockfile's runs; results of combinations no longer resolved are
  kept under ``retired``; every run has a ``date`` and every entry with runs
  a ``last_verified``.
- Results files that cannot be merged (`results`) abort ``envbuilder lock``
  with exit 2 and nothing written, unless ``--skip-rejected`` is given: then
  the lockfile is written and lists them under ``rejected_results``.

Submodules: `model` (records), `evidence`, `canonical`, `verdicts`, `recheck`, `read`,
`shape`, `drivers`, `sourcebuilds`. Making the document is `envbuilder.aggregate`
(`results`, `claims`, `merge`); using it is `envbuilder.consumer` (`query`, `advice`,
`export`, `install`, `doctor`, `host`, ...). Importing this package imports only the
standard library. The modules that moved out are still importable under their old
names here, with a `DeprecationWarning`, for one release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

from envbuilder.lockfile.model import COMPAT_SCHEMA, DEFAULT_LOCKFILE, CompatLock, Entry
from envbuilder.lockfile.read import default_lockfile, load_lockfile

__all__ = [
    "COMPAT_SCHEMA",
    "DEFAULT_LOCKFILE",
    "CompatLock",
    "Entry",
    "default_lockfile",
    "load_lockfile",
]

#: modules that lived here before the lockfile's making and use got packages of their own
MOVED: dict[str, str] = {
    **{name: "envbuilder.aggregate" for name in ("claims", "merge", "results")},
    **{
        name: "envbuilder.consumer"
        for name in (
            "_checkcache", "_envprobe", "_extload", "_smoke", "advice", "doctor", "export", "host",
            "install", "installed", "interpreter", "provenance", "published", "published_wheel",
            "query", "record_check", "runtime_path", "snapshot",
        )
    },
}  # fmt: skip


class _MovedLoader(importlib.abc.Loader):
    """Hands out the module at its new home under its old name."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module ran at its new home."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``envbuilder.lockfile.<moved>`` (see `MOVED`)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(
            fullname, _MovedLoader(fullname, f"{MOVED[name]}.{name}")
        )


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
