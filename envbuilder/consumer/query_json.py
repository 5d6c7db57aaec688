"""``query --json``'s answer: everything the text leaves out, as one document.

`json_answer` says which lockfile answered, the interpreter and host judged for (with
``--here``), the query as asked, every match with its verdict, causes, advisories and
evidence, and every rejection with its reasons. The caller reads the clock (*now*).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import date, datetime
from typing import TYPE_CHECKING

from envbuilder.consumer.advice import action, advisory_line, causes, dated, verdict_date
from envbuilder.consumer.query import Answer, Match, Query
from envbuilder.lockfile.model import CompatLock, LastVerified

if TYPE_CHECKING:
    from pathlib import Path

    from envbuilder.consumer.host import Host
    from envbuilder.consumer.interpreter import Interpreter

__all__ = ["json_answer", "lockfile_json", "match_json"]


def _last_verified(last: LastVerified | None) -> dict[str, object] | None:
    """When the verdict was last measured: its runs, or the stale evidence while the current
    lock has no runs of its own (``lock_sha256`` says which lock)."""
    if last is None:
        return None
    return {
        "date": last.date,
        "lock_sha256": last.lock_sha256,
        "suite_version": last.suite_version,
        "verdict": last.verdict.verdict,
        "uses": {u.use: u.verdict.verdict for u in last.uses},
        "text": last.describe(),
    }


def lockfile_json(
    path: Path, url: str | None, lock: CompatLock, now: datetime
) -> dict[str, object]:
    """Which lockfile answered (its *path*; the *url* it came from, without a password;
    whether it is the snapshot this envbuilder carries) and how old its newest evidence is."""
    from envbuilder.consumer.snapshot import is_carried, newest_evidence
    from envbuilder.credentials import redact_text

    day = newest_evidence(lock)
    return {
        "path": str(path),
        "url": redact_text(url) if url else None,
        "carried": is_carried(path),
        "newest_evidence": day,
        "age_days": (now.date() - date.fromisoformat(day)).days if day else None,
    }


def match_json(m: Match, now: datetime) -> dict[str, object]:
    """One match whole: the combination, its verdict with what to do and why, its
    advisories, dates and evidence."""
    cc = m.compute_capability
    return {
        "id": m.entry.id,
        "python": m.entry.python,
        "cuda": m.entry.cuda,
        "platform": m.entry.platform,
        "arch": m.entry.arch,
        "cuda_release": m.entry.cuda_release,
        "minimum_driver": m.entry.minimum_driver,
        "torch": m.entry.torch,
        "xformers": m.entry.xformers,
        "compute_capability": m.compute_capability,
        "use": m.use,
        "verdict": m.verdict.verdict,
        "reason": m.verdict.reason,
        "workarounds": list(m.verdict.workarounds),
        "failing_checks": list(m.verdict.failing_checks),
        "choices": [asdict(c) for c in m.verdict.choices],
        "options": [asdict(o) for o in m.verdict.options],
        "suite_errors": list(m.verdict.suite_errors),
        "advisories": [
            {
                **asdict(a),
                "line": advisory_line(m.entry, a, cc),
                "causes": [{**asdict(c), "repro": c.repro} for c in causes(m.entry, a.verdict, cc)],
            }
            for a in m.verdict.advisories
        ],
        "action": action(m.verdict, m.replacement),
        "replacement": None
        if m.replacement is None
        else {"id": m.replacement.id, "verdict": m.replacement.verdict.verdict},
        "date": verdict_date(m.entry, cc),
        "dated": dated(m.entry, m.verdict, now, cc, m.use),
        "causes": [{**asdict(c), "repro": c.repro} for c in causes(m.entry, m.verdict, cc)],
        "uses": {u.use: u.verdict.verdict for u in m.uses},
        "lock": m.entry.lock.path if m.entry.lock else None,
        "last_verified": _last_verified(m.entry.last_verified),
        "evidence": None if m.evidence is None else asdict(m.evidence),
        "changes": [asdict(c) for c in m.changes],
        "suggestion": m.suggestion,
        "warnings": list(m.warnings),
        "source_build": m.entry.source_build.to_json() if m.entry.source_build else None,
    }


def json_answer(
    lock: CompatLock,
    result: Answer,
    query: Query,
    now: datetime,
    *,
    path: Path,
    url: str | None = None,
    interpreter: Interpreter | None = None,
    host: Host | None = None,
) -> dict[str, object]:
    """``query --json``: the lockfile at *path* (from *url*), the *interpreter* and *host*
    judged for (``--here``), *query*, and *result*'s matches and rejections."""
    return {
        "lockfile": lockfile_json(path, url, lock, now),
        "interpreter": None
        if interpreter is None
        else {
            "executable": str(interpreter.executable),
            "version": interpreter.version,
            "chosen_by": interpreter.source,
        },
        "host": None if host is None else asdict(host),
        "query": asdict(query),
        "matches": [match_json(m, now) for m in result.matches],
        "rejected": [{"id": r.entry.id, "reasons": list(r.reasons)} for r in result.rejected],
    }
