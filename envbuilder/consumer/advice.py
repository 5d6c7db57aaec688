"""What a verdict tells users to do, in one line, and why, grouped by cause (pure).

`query`, the site and ``compat.md`` all say the same thing through these functions:
the one action of a verdict (keep xformers with a change, use the torch-alone row, or
nothing works), how many gate checks failed, the verdict's date and age, and the failing
checks grouped by cause with the component at fault and a command that reproduces one.
"now" is always a parameter: the caller reads the clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from envbuilder.consumer.query import Match, Replacement
from envbuilder.lockfile.model import (
    VERDICT_RANK,
    Advisory,
    CheckOutcome,
    Entry,
    Use,
    UseVerdict,
    Verdict,
    WorkaroundOption,
    use_verdict,
)
from envbuilder.lockfile.verdicts import FAILED, cost_text

__all__ = [
    "LINE_WIDTH",
    "WORKAROUND_ACTION",
    "Cause",
    "action",
    "advisories",
    "advisory_line",
    "age",
    "cause_line",
    "causes",
    "column_widths",
    "count_text",
    "dated",
    "failing_count",
    "fit",
    "grouped",
    "normalise_reason",
    "one_line",
    "short_age",
    "use_counts",
    "verdict_date",
    "wrapped",
]

#: the most characters `one_line` writes
LINE_WIDTH = 120

#: how users apply each workaround, as an instruction
WORKAROUND_ACTION: Mapping[str, str] = {
    "mask-outside-compile": "build the attention bias object outside the compiled function",
    "mask-form": "hand the backend the mask in the form the check passed with",
    "dynamo-disable": "wrap attn in torch.compiler.disable",
    "sdpa-under-compile": "use SDPA in xformers' place under torch.compile",
    "sdpa-instead": "use SDPA in xformers' place",
}
#: the same, for a workaround applied to a library the suite reached the kernels through
VIA_ACTION: Mapping[tuple[str, str], str] = {
    ("diffusers", "sdpa-instead"): "use diffusers' native attention backend",
    ("diffusers", "sdpa-under-compile"): "use diffusers' native attention backend",
    (
        "diffusers",
        "mask-form",
    ): "hand diffusers' xformers backend the mask form the check passed with",
}


def age(day: str, now: datetime, *, short: bool = False) -> str:
    """How long ago *day* (YYYY-MM-DD) was: ``today``, ``1 day ago`` (``1d ago`` when short)."""
    try:
        then = date.fromisoformat(day[:10])
    except ValueError:
        return "date unknown"
    days = (now.astimezone(UTC).date() - then).days
    if days < 0:
        return "in the future" if not short else "future"
    if days == 0:
        return "today"
    if not short:
        return f"{days} day{'s' if days != 1 else ''} ago"
    if days < 60:
        return f"{days}d ago"
    if days < 730:
        return f"{days // 30}mo ago"
    return f"{days // 365}y ago"


def _finished_day(finished: str) -> str | None:
    try:
        moment = datetime.fromisoformat(finished)
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.date().isoformat()


def verdict_date(entry: Entry, cc: str | None = None) -> str | None:
    """When the newest run counted for *entry*'s verdict finished (on GPUs of compute
    capability *cc* when given), YYYY-MM-DD in UTC; None without such runs."""
    days = [
        d
        for r in entry.runs
        if cc is None or r.compute_capability == cc
        if (d := _finished_day(r.finished)) is not None
    ]
    return max(days, default=None)


def dated(
    entry: Entry, verdict: Verdict, now: datetime, cc: str | None = None, use: Use | None = None
) -> str:
    """When *verdict* was measured: ``measured 2026-11-30, 1 day ago`` (the newest run
    counted, whatever the verdict); for a combination whose lock moved since its runs, the
    stale evidence (``last verified 2026-11-12 on lock <sha12>: verified, 19 days ago``, of
    *use* when given); ``never run`` or ``not resolvable`` where there is no date."""
    day = verdict_date(entry, cc)
    if day is not None:
        return f"measured {day}, {age(day, now)}"
    last = entry.last_verified
    if last is not None and not entry.runs:
        then = use_verdict(last.uses, use) if use is not None else None
        return f"{last.describe(then)}, {age(last.date, now)}"
    if verdict.verdict == "unsatisfiable":
        return "not resolvable"
    return "never run"


def _short_age(entry: Entry, now: datetime, cc: str | None) -> str:
    day = verdict_date(entry, cc)
    if day is None and entry.last_verified is not None and not entry.runs:
        day = entry.last_verified.date
    return age(day, now, short=True) if day is not None else "–"


def _cost(option: WorkaroundOption) -> str:
    text = cost_text(option)
    return f" ({text})" if text else ""


def _do(option: WorkaroundOption, via: str | None = None) -> str:
    said = VIA_ACTION.get((via or "", option.workaround)) or WORKAROUND_ACTION.get(
        option.workaround, f"apply {option.workaround}"
    )
    return said + _cost(option)


def failing_count(verdict: Verdict) -> int:
    """The failed direct gate checks the verdict names (for ``broken``: those not covered)."""
    return len(verdict.failing_checks)


def action(verdict: Verdict, replacement: Replacement | None = None) -> str:
    """The one thing to do about *verdict*."""
    name = verdict.verdict
    if name == "verified":
        return "nothing to change"
    if name == "verified-with-workaround":
        chosen = set(verdict.workarounds)
        keep = [o for o in verdict.options if o.workaround in chosen and o.keeps_xformers]
        runtime = [w.removeprefix("cuda-runtime:") for w in verdict.workarounds if ":" in w]
        if keep:
            return " and ".join(_do(o) for o in keep)
        if runtime:
            return f"install as locked (adds {', '.join(runtime)})"
        return "apply " + ", ".join(verdict.workarounds)
    if name == "xformers-unusable":
        if replacement is not None:
            how = "verified" if replacement.verdict.verdict == "verified" else "with a workaround"
            return f"use {replacement.id} ({how})"
        replacing = [o for o in verdict.options if not o.keeps_xformers]
        if replacing:
            return _do(replacing[0])
        return "do not use xformers here"
    if name == "broken":
        return "no workaround works (see the causes)"
    if name == "unsatisfiable":
        return verdict.reason  # the resolver's, whole: it may hold "; " itself
    if "no conformance results" in verdict.reason:
        return "not measured yet: choose a verified row"
    return verdict.reason.split("; ")[0]  # what is missing, without the stale evidence


def wrapped(line: str, width: int) -> str:
    """*line* on as many lines as *width* needs, broken between words (never inside one), the
    rest indented four more than its text; a line that fits is returned as it is."""
    import textwrap

    if len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return "\n".join(
        textwrap.wrap(
            line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
        )
    )


def fit(text: str, width: int) -> str:
    """*text* within *width* characters: whole, or cut after the last whole word that fits
    and marked with "…" (inside a word only where the first word alone is too wide)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"
    kept = text[: width - 1]
    if text[width - 1] != " " and not kept.endswith(" ") and " " in kept.strip():
        kept = kept.rsplit(" ", 1)[0]
    return kept.rstrip(" ,;:") + "…"


def count_text(verdict: Verdict) -> str:
    """The failing-checks column: the count, or ``–`` where nothing was judged."""
    if verdict.verdict in ("unverified", "unsatisfiable") and not verdict.failing_checks:
        return "–"
    return str(failing_count(verdict))


def use_counts(uses: Sequence[UseVerdict]) -> str:
    """The failing-checks column of an answer for every use: the count of the worst use
    (the most, where several are as bad), never a union over uses; ``–`` where nothing was
    judged."""
    judged = [u for u in uses if count_text(u.verdict) != "–"]
    if not judged:
        return "–"
    rank = max(VERDICT_RANK[u.verdict.verdict] for u in judged)
    return str(
        max(failing_count(u.verdict) for u in judged if VERDICT_RANK[u.verdict.verdict] == rank)
    )


def short_age(entry: Entry, now: datetime, cc: str | None = None) -> str:
    """The age column: ``today``, ``5d ago``; ``–`` where there is no date."""
    return _short_age(entry, now, cc)


def one_line(
    match: Match,
    now: datetime,
    *,
    verdict_width: int = 0,
    id_width: int = 0,
    count_width: int = 0,
    age_width: int = 0,
    width: int = LINE_WIDTH,
) -> str:
    """One combination's answer in at most *width* characters: verdict, id, how many
    gate checks failed, the verdict's age, then the one action (its cost dropped, then cut,
    when it has no room). The widths align the columns of several lines."""
    v = match.verdict
    head = (
        f"{v.verdict:<{verdict_width}} {match.entry.id:<{id_width}} "
        f"{_count_of(match):>{count_width}} "
        f"{_short_age(match.entry, now, match.compute_capability):<{age_width}} "
    )
    todo = action(v, match.replacement)
    room = width - len(head)
    if len(todo) > room:
        todo = re.sub(r" \([^()]*\)$", "", todo)
    return (head + fit(todo, room)).rstrip()


def _count_of(match: Match) -> str:
    """Per use when the answer is for every use (`use_counts`), else that use's count."""
    return use_counts(match.uses) if match.use is None and match.uses else count_text(match.verdict)


def column_widths(matches: Sequence[Match], now: datetime) -> dict[str, int]:
    """The `one_line` widths that align *matches*' columns."""
    return {
        "verdict_width": max((len(m.verdict.verdict) for m in matches), default=0),
        "id_width": max((len(m.entry.id) for m in matches), default=0),
        "count_width": max((len(_count_of(m)) for m in matches), default=0),
        "age_width": max(
            (len(_short_age(m.entry, now, m.compute_capability)) for m in matches), default=0
        ),
    }


@dataclass(frozen=True, kw_only=True)
class Cause:
    """Failing checks that share one cause: what it is, who is at fault, how to re-run it."""

    text: str  # the check's ``numbers.cause``, else its reason's first line, normalised
    #: who an experiment found at fault (torch, xformers, diffusers), else ``undecided``
    #: (`CheckOutcome.fault`: a component read from a message is no finding)
    component: str | None
    op: str | None  # ``numbers.fault_op``: the failing op or function, when known
    evidence: str | None = None  # the experiment that decided ``component``
    checks: tuple[str, ...]  # sorted
    workarounds: tuple[str, ...]  # verified on every one of these checks, cheapest first
    #: verified on some of these checks only: (workaround, how many), cheapest first
    partial: tuple[tuple[str, int], ...] = ()

    @property
    def repro(self) -> str:
        """The command that writes a standalone script re-running one of the checks."""
        return f"envbuilder repro {self.checks[0]}"


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def normalise_reason(reason: str) -> str:
    """A reason's first line with its numbers replaced by ``#``: checks that failed the same
    way with other numbers share it."""
    first = (reason.strip().splitlines() or [""])[0].split(" | ")[0]
    return " ".join(_NUMBER.sub("#", first).split())[:100] or "no reason recorded"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _outcomes(entry: Entry, cc: str | None) -> dict[str, CheckOutcome]:
    """Each failed check's outcome, from the run with the most checks that has it failing."""
    runs = [r for r in entry.runs if cc is None or r.compute_capability == cc]
    found: dict[str, CheckOutcome] = {}
    for run in sorted(runs, key=lambda r: -len(r.checks)):
        for check in run.checks:
            if check.status in FAILED:
                found.setdefault(check.name, check)
    return found


def causes(entry: Entry, verdict: Verdict, cc: str | None = None) -> list[Cause]:
    """*verdict*'s failing checks grouped by (cause, who is at fault), the cause with most
    checks first; what works on some of a group only is counted within that group."""
    outcomes = _outcomes(entry, cc)
    groups: dict[tuple[str, str | None], list[str]] = {}
    ops: dict[tuple[str, str | None], str | None] = {}
    evidence: dict[tuple[str, str | None], str | None] = {}
    for name in verdict.failing_checks:
        check = outcomes.get(name)
        numbers = check.numbers if check is not None else {}
        text = _text(numbers.get("cause")) or (
            normalise_reason(check.reason) if check is not None else "no outcome recorded"
        )
        key = (text, check.fault if check is not None else None)
        groups.setdefault(key, []).append(name)
        ops.setdefault(key, _text(numbers.get("fault_op")))
        evidence.setdefault(key, check.fault_evidence if check is not None else None)
    out = []
    for (text, component), names in groups.items():
        op = ops[(text, component)]
        mine = set(names)
        working = tuple(o.workaround for o in verdict.options if mine <= set(o.fixes))
        partial = tuple(
            (o.workaround, len(mine & set(o.fixes)))
            for o in verdict.options
            if mine & set(o.fixes) and not mine <= set(o.fixes)
        )
        out.append(
            Cause(
                text=text,
                component=component,
                op=op,
                evidence=evidence[(text, component)],
                checks=tuple(sorted(names)),
                workarounds=working,
                partial=partial,
            )
        )
    return sorted(out, key=lambda c: (-len(c.checks), c.text))


def cause_line(cause: Cause, width: int = 200) -> str:
    """One cause in one line: how many checks, what, who is at fault, what passes them, and
    the command that reproduces one; the cause's text is cut to fit *width*, and the
    failing op is left to ``--json`` where the line has no room for it."""
    n = len(cause.checks)
    passing = [", ".join(cause.workarounds)] if cause.workarounds else []
    passing += [f"{w} on {k} of {n}" for w, k in cause.partial]
    rest = f" (ok with {'; '.join(passing)})" if passing else ""
    rest += f" repro: {cause.repro}"
    head = f"{n} check{'s' if n != 1 else ''}: "

    def tail(op: str | None) -> str:
        fault = cause.component or ""
        if op:
            fault += f" ({op})" if fault else op
        return (f" [{fault}]" if fault else "") + rest

    end = tail(cause.op)
    if len(head) + min(len(cause.text), 40) + len(end) > width:
        end = tail(None)
    return head + fit(cause.text, max(width - len(head) - len(end), 40)) + end


def grouped(entry: Entry, verdict: Verdict, cc: str | None = None) -> Sequence[str]:
    """`cause_line` of each of `causes`."""
    return [cause_line(c) for c in causes(entry, verdict, cc)]


def _phrase(cause: str) -> str:
    """A cause as an advisory's headline says it: ``error above bound: diffusers xformers
    backend, 4-D boolean mask`` is ``wrong with 4-D boolean mask``."""
    kind, sep, subject = cause.partition(": ")
    case = subject.rsplit(", ", 1)[-1] if sep else ""
    if kind == "error above bound" and case:
        return f"wrong with {case}"
    if kind == "NaN/inf values" and case:
        return f"NaN/inf with {case}"
    return cause


def advisories(verdict: Verdict) -> list[Advisory]:
    """The advisories worth a line: a library whose verdict is short of ``verified`` and
    was measured (an ``unverified`` one has nothing to say)."""
    return [a for a in verdict.advisories if a.verdict.verdict not in ("verified", "unverified")]


def advisory_line(
    entry: Entry, item: Advisory, cc: str | None = None, width: int = LINE_WIDTH
) -> str:
    """One advisory in one line: the library with its version and backend, what is wrong
    (its largest cause), the cheapest measured fix with its cost, then its verdict (the
    part cut first where *width* has no room for all of it)."""
    found = causes(entry, item.verdict, cc)
    what = _phrase(found[0].text) if found else item.verdict.reason
    fix = item.verdict.options[0] if item.verdict.options else None
    todo = f"; fix: {_do(fix, item.via)}" if fix is not None else "; no measured fix"
    tail = f" [{item.verdict.verdict}, not pinned by this row]"  # first to go when cut
    return fit(f"{item.name}: {what}{todo}{tail}", width)
