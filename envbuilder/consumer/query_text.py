"""``query``'s answer as text: one screen, best first (pure).

Every answer fits the terminal (its width, and at most `SCREEN_LINES` lines): one line
per combination (`advice.one_line`), a line too wide cut at a word with "…" and a list too
long cut with "… N more"; ``--long`` or a combination's id adds its failing checks grouped
by cause. `text_answer` lays out the whole answer (the machine judged for, the matches,
then the warnings and rejections); `render` the list of matches alone. The caller reads
the terminal's size and the clock, and passes them in (`Layout`, *now*).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from envbuilder.consumer.advice import (
    action,
    advisories,
    advisory_line,
    cause_line,
    causes,
    column_widths,
    count_text,
    dated,
    fit,
    one_line,
)
from envbuilder.consumer.query import Answer, Match, Query, replacement
from envbuilder.gpus import gpu_model, sm
from envbuilder.lockfile.drivers import COMPATIBILITY_SOURCE, DRIVER_SOURCE
from envbuilder.lockfile.model import INSTALLABLE, VERDICT_RANK, CompatLock, Use

if TYPE_CHECKING:
    from envbuilder.consumer.host import Host

__all__ = [
    "SCREEN_COLUMNS",
    "SCREEN_LINES",
    "Layout",
    "ThisMachine",
    "render",
    "text_answer",
    "wrap_sentence",
]

#: the most lines one answer takes, however tall the terminal
SCREEN_LINES = 40
#: the width where output is not a terminal (a pipe or a file keeps what the old fixed
#: limit kept: a reader there has no screen to fit)
SCREEN_COLUMNS = 200


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How much of the answer is shown: within *width* columns and *height* lines unless
    *everything* (``--all``); with *long* (``--long``), each row's failing checks by cause."""

    width: int = SCREEN_COLUMNS
    height: int = SCREEN_LINES
    long: bool = False
    everything: bool = False


@dataclass(frozen=True, kw_only=True)
class ThisMachine:
    """``--here``: the host the answer is for, the line naming the interpreter judged for,
    and the options given that override what was detected (``--gpu H100``)."""

    host: Host
    interpreter_line: str
    overridden: tuple[str, ...] = ()


def wrap_sentence(text: str, width: int) -> str:
    """A sentence on as many lines as *width* needs, broken between words."""
    return "\n".join(
        textwrap.wrap(
            text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    )


def _advisory_lines(
    m: Match, *, indent: str = "    ", long: bool = False, width: int = SCREEN_COLUMNS
) -> list[str]:
    """Each advisory of *m*'s verdict on one line (a library the row does not pin); with
    *long*, its causes (who is at fault, by which experiment) and who is hit under it."""
    cc = m.compute_capability
    room = width - len(indent) - 2
    lines = []
    for a in advisories(m.verdict):
        lines.append(f"{indent}! {advisory_line(m.entry, a, cc, room)}")
        if not long:
            continue
        for c in causes(m.entry, a.verdict, cc):
            lines.append(f"{indent}    {cause_line(c, room - 4)}")
            if c.evidence:
                lines.append(f"{indent}      decided by: {c.evidence}")
        for i in a.info:
            finding = i.reason.split("; ")[0]  # the finding, not the advice a suite gave
            if finding:
                said = f"{i.name.rsplit('.', 1)[-1]} {i.status}"
                lines.append(f"{indent}    who is hit ({said}): {finding}")
    return [fit(line, width) for line in lines]


def _advisory_footer(matches: Sequence[Match], width: int = SCREEN_COLUMNS) -> list[str]:
    """Each advisory of the listed rows once, with how many rows it concerns: a library the
    rows do not pin (``--long`` shows its causes under each row)."""
    found: dict[str, list[Match]] = {}
    for m in matches:
        for a in advisories(m.verdict):
            key = advisory_line(m.entry, a, m.compute_capability, 1000)
            found.setdefault(key, []).append(m)
    return [
        fit(f"! {len(rows)} row{'s' if len(rows) != 1 else ''}: {key}", width)
        for key, rows in found.items()
    ]


def _detail(
    m: Match, now: datetime, *, indent: str = "    ", width: int = SCREEN_COLUMNS
) -> list[str]:
    """Under a combination's line: its date, then each failing cause on one line, the
    advisories of libraries the row does not pin, and the suite's own errors."""
    cc = m.compute_capability
    lines = [f"{indent}{dated(m.entry, m.verdict, now, cc, m.use)}"]
    for c in causes(m.entry, m.verdict, cc):
        lines.append(f"{indent}{cause_line(c, width - len(indent))}")
        if c.evidence:
            lines.append(f"{indent}  decided by: {c.evidence}")
    others = [o.workaround for o in m.verdict.options if o.workaround not in m.verdict.workarounds]
    if others:
        lines.append(f"{indent}also verified on some of these checks: {', '.join(others)}")
    lines += _advisory_lines(m, indent=indent, long=True, width=width)
    if m.verdict.suite_errors:
        n = len(m.verdict.suite_errors)
        lines.append(
            f"{indent}{n} suite error{'s' if n != 1 else ''} (the suite's own bug, counted "
            f"nowhere): {', '.join(m.verdict.suite_errors)}"
        )
    return [fit(line, width) for line in lines]


def _one_combination(
    lock: CompatLock, match: Match, use: Use | None, now: datetime, width: int = SCREEN_COLUMNS
) -> list[str]:
    """``query ID``: per use (or for *use* only) the line, its date and its causes."""
    cc = match.compute_capability
    lines = [f"{match.entry.id}: {match.verdict.verdict} overall"]
    if match.entry.source_build is not None:
        from envbuilder.lockfile.sourcebuilds import describe

        lines.append(describe(match.entry.source_build, match.entry.id))
    for u in match.uses:
        if use is not None and u.use != use:
            continue
        alternative = (
            replacement(lock, match.entry, u.use, cc)
            if u.verdict.verdict == "xformers-unusable"
            else None
        )
        per_use = replace(match, verdict=u.verdict, use=u.use, replacement=alternative)
        count = count_text(u.verdict)
        lines.append(
            f"{u.use:<18} {u.verdict.verdict:<24} {count:>3} failing  "
            f"{action(u.verdict, alternative)}"
        )
        lines += _detail(per_use, now, width=width)
    return [fit(line, width) for line in lines]


def _has_detail(m: Match) -> bool:
    """Whether ``--long`` has more to say about *m* than its line: its failing causes, an
    advisory, a suite error, or the stale evidence of a combination whose lock moved since
    its runs."""
    if m.verdict.verdict == "unsatisfiable":
        return False
    if m.verdict.verdict == "verified":
        return bool(advisories(m.verdict) or m.verdict.suite_errors)
    return m.verdict.verdict != "unverified" or (
        not m.entry.runs and m.entry.last_verified is not None
    )


def _evidence(m: Match) -> str:
    """For a GPU, where the combination was verified (or "untested"), to end its line."""
    if m.compute_capability is None or m.verdict.verdict == "unsatisfiable":
        return ""
    said = m.evidence.text if m.evidence is not None else "untested on any GPU"
    if m.evidence is None and m.entry.gpus:
        said = _measured_uses(m)
    return f"  [{said}]"


def _measured_uses(m: Match) -> str:
    """Where a combination whose worst use is not verified was measured, and the uses that
    are verified there (``measured on H200: inference, training verified;
    inference-compiled with a workaround``)."""
    gpus = ", ".join(g.gpu for g in m.entry.gpus)
    plain = [u.use for u in m.entry.uses if u.verdict.verdict == "verified"]
    worked = [u.use for u in m.entry.uses if u.verdict.verdict == "verified-with-workaround"]
    parts = [f"{', '.join(plain)} verified"] if plain else []
    parts += [f"{', '.join(worked)} with a workaround"] if worked else []
    return f"measured on {gpus}: {'; '.join(parts) or 'no use verified'}"


def render(
    answer: Answer,
    *,
    use: Use | None,
    now: datetime,
    long: bool = False,
    everything: bool = False,
    width: int = SCREEN_COLUMNS,
    height: int = SCREEN_LINES,
) -> list[str]:
    """The matches of *answer*, one line each of at most *width* characters, within
    *height* lines unless *everything*: combinations with no results at all are counted
    rather than listed, then the rest is cut with a line saying how to see it."""
    matches = list(answer.matches)
    lines = textwrap.wrap(
        (f"verdicts for {use}:" if use else "verdicts (the worst of the four uses):")
        + f" verdict, combination, failing checks, age (now {now:%Y-%m-%d}), what to do",
        width,
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    silent = [
        m
        for m in matches
        if not m.entry.runs and m.entry.last_verified is None and m.verdict.verdict == "unverified"
    ]
    budget = height - len(lines) - 1  # the header and one line for what is left out
    shown = matches
    if not everything and len(matches) * (1 + 4 * long) > budget and silent:
        shown = [m for m in matches if m not in silent]
    footer = [] if long else _advisory_footer([m for m in shown if m.entry.runs], width)
    budget -= len(footer)
    widths = column_widths(shown, now)
    body: list[str] = []
    cut = 0
    for i, m in enumerate(shown):
        row, said = one_line(m, now, **widths, width=width), _evidence(m)
        # where the GPU evidence has no room beside the action, it takes its own line
        block = [row + said] if len(row + said) <= width else [row, fit(f"    {said[2:]}", width)]
        if m.suggestion:
            block.append(fit(f"    ↳ {m.suggestion}", width))
        if long and _has_detail(m):
            block += _detail(m, now, width=width)
        if not everything and len(body) + len(block) > budget:
            cut = len(shown) - i
            break
        body += block
    lines += body
    if not long:
        lines += _advisory_footer([m for m in shown[: len(shown) - cut] if m.entry.runs], width)
    notes = []
    if shown is not matches:
        notes.append(f"{len(silent)} more with no results yet")
    if cut:
        notes.append(f"{cut} more not shown")
    if notes:
        lines.append(
            f"… {', '.join(notes)}: narrow with --python/--cuda/--torch/--gpu, or list all with --all"
        )
    return [fit(line, width) for line in lines]


def _machine_lines(here: ThisMachine, width: int) -> list[str]:
    """``--here``: the interpreter judged for (its reason whole, not cut), the machine, the
    options that overrode what was detected, and which GPU of several was judged for."""
    host = here.host
    lines = wrap_sentence(here.interpreter_line, width).splitlines()
    lines.append(f"this machine: {host.describe()}")
    if here.overridden:
        lines.append(f"overridden: {' '.join(here.overridden)}")
    if len({g.compute_capability for g in host.gpus}) > 1:
        lines.append(f"judged for the first GPU, {host.gpus[0].name}")
    return lines


def _warning_lines(matches: Sequence[Match]) -> list[str]:
    """Each warning once, with how many listed rows it concerns, then the rules' sources."""
    counts: dict[str, int] = {}
    for m in matches:
        for warning in m.warnings:
            counts[warning] = counts.get(warning, 0) + 1
    if not counts:
        return []
    lines = [f"! {n} row{'s' if n != 1 else ''}: {warning}" for warning, n in counts.items()]
    lines.append(f"  rule: {COMPATIBILITY_SOURCE}")
    lines.append(f"  full-support drivers: {DRIVER_SOURCE}")
    return lines


def _rejection_lines(result: Answer, *, everything: bool) -> list[str]:
    """One line per reason: rows sharing a reason are counted on one line ("9 rows, e.g.
    ID: built for x86_64 …, not aarch64"), a row with several reasons counts in each; with
    *everything*, one line per row with all its reasons."""
    if everything:
        return [f"  {r.entry.id}: {r.reason}" for r in result.rejected]
    groups: dict[str, list[str]] = {}
    for r in result.rejected:
        for reason in r.reasons:
            groups.setdefault(reason, []).append(r.entry.id)
    lines = []
    for reason, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        if len(ids) == 1:
            lines.append(f"  {ids[0]}: {reason}")
        else:
            lines.append(f"  {len(ids)} rows, e.g. {ids[0]}: {reason}")
    return lines


def _gpu_summary(lock: CompatLock) -> list[str]:
    """Without a GPU here: that nothing here can use CUDA, and per GPU model measured, the
    combinations verified on it (best first), so that the answer still says what runs where."""
    cuda = [e for e in lock.combinations if e.cuda_release is not None]
    lines = [
        f"no NVIDIA GPU here: none of the {len(cuda)} CUDA builds can use CUDA on this machine; "
        "verified on which GPU:"
    ]
    per_gpu: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for entry in cuda:
        for g in entry.gpus:
            if g.verdict.verdict in INSTALLABLE:
                key = (gpu_model(g.gpu) or g.gpu, g.compute_capability or "?")
                per_gpu.setdefault(key, []).append((VERDICT_RANK[g.verdict.verdict], entry.id))
    for (model, cc), rows in sorted(per_gpu.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = [i for _, i in sorted(rows)]
        shown = ", ".join(ids[:3]) + (f", … {len(ids) - 3} more" if len(ids) > 3 else "")
        lines.append(f"  {model} ({sm(cc)}): {len(ids)} verified: {shown}")
    if not per_gpu:
        lines.append("  none verified on any GPU yet")
    lines.append("  (--gpu NAME answers for one of them)")
    return lines


def _notes(
    lock: CompatLock,
    result: Answer,
    query: Query,
    *,
    listed: bool,
    host_decides: bool,
    layout: Layout,
) -> list[str]:
    """What follows the matches: the warnings of a list (*listed*), the GPUs verified on
    when there is none here, then the rejections where they are news, cut to a quarter of
    the screen unless everything is asked for."""
    lines = _warning_lines(result.matches) if listed else []
    if query.no_gpu:
        lines += _gpu_summary(lock)
    if (host_decides or not result.matches) and result.rejected:
        lines.append(
            f"{'not for this host' if host_decides else 'not matching'} ({len(result.rejected)}):"
        )
        reason_lines = _rejection_lines(result, everything=layout.everything)
        room = max(layout.height // 4, 2)
        if layout.everything or len(reason_lines) <= room:
            lines += reason_lines
        else:
            lines += reason_lines[: room - 1]
            lines.append(f"  … {len(reason_lines) - room + 1} more (--all lists them)")
    return lines


def _combination_body(
    lock: CompatLock, match: Match, use: Use | None, now: datetime, layout: Layout, room: int
) -> list[str]:
    """``query ID`` within *room* lines unless everything is asked for, the cut said."""
    body = _one_combination(lock, match, use, now, layout.width)
    if not layout.everything and len(body) > room:
        cut = len(body) - room + 1
        said = f"… {cut} more lines: --use USE narrows, --all shows them, --json holds everything"
        body = [*body[: room - 1], said]
    return body


def text_answer(
    lock: CompatLock,
    result: Answer,
    query: Query,
    now: datetime,
    *,
    layout: Layout,
    combination: str | None = None,
    here: ThisMachine | None = None,
    host_decides: bool = False,
) -> list[str]:
    """``query``'s whole answer, each line within the layout's width: the machine judged
    for (*here*), the matches (or, for *combination*, its verdict per use) in the room the
    rest leaves, then the warnings, the GPUs verified on where there is none here, and the
    rejections where they explain: the host decided them (*host_decides*: a Grace GPU implies
    aarch64) or nothing matched; a plain filter's misses are not news."""
    width = layout.width
    head = _machine_lines(here, width) if here is not None else []
    tail = _notes(
        lock, result, query, listed=combination is None, host_decides=host_decides, layout=layout
    )
    room = max(layout.height - len(head) - len(tail), 4)
    body: list[str] = []
    if result.matches and combination is not None:
        body = _combination_body(lock, result.matches[0], query.use, now, layout, room)
    elif result.matches:
        body = render(
            result,
            use=query.use,
            now=now,
            long=layout.long,
            everything=layout.everything,
            width=width,
            height=room,
        )
    return [fit(line, width) for line in head + body + tail]
