"""``envbuilder query``: the lockfile's combinations that match, best first.

Every answer fits the terminal (its width, and at most `SCREEN_LINES` lines): one line
per combination (`advice.one_line`), a line too wide cut at a word with "…" and a list too
long cut with "… N more"; ``--long`` or a combination's id adds its failing checks grouped
by cause; ``--json`` holds everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands._lockfile_args import add_lock_argument, add_selection_arguments
from envbuilder.consumer.advice import fit

if TYPE_CHECKING:
    from envbuilder.consumer.host import Host
    from envbuilder.consumer.interpreter import Interpreter
    from envbuilder.consumer.query import Answer, Match, Query
    from envbuilder.lockfile.model import CompatLock, LastVerified, Use

#: the most lines one answer takes, however tall the terminal
SCREEN_LINES = 40
#: the width where output is not a terminal (a pipe or a file keeps what the old fixed
#: limit kept: a reader there has no screen to fit)
SCREEN_COLUMNS = 200

HELP = "list the lockfile's combinations matching --python/--cuda/--torch/--gpu, best first (--use: by one use's verdict; --here: for this machine)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id",
        nargs="?",
        metavar="ID",
        help="one combination: its verdict per use (or for --use), each with the failing "
        "checks grouped by cause",
    )
    add_lock_argument(parser)
    add_selection_arguments(parser)
    parser.add_argument(
        "--arch",
        metavar="ARCH",
        help="CPU architecture of the host: x86_64 or aarch64 (amd64, arm64 accepted)",
    )
    parser.add_argument(
        "--driver",
        metavar="VERSION",
        help="the host's NVIDIA driver version, e.g. 550.54.15: a combination whose CUDA "
        "release needs a newer one is kept with a warning where NVIDIA's minor-version "
        "compatibility runs it, and rejected otherwise",
    )
    parser.add_argument(
        "--here",
        action="store_true",
        help="for this machine: detect Python, architecture, GPU and driver (NVML or "
        "nvidia-smi); explicit options override what is detected",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help="under each combination, its failing checks grouped by cause (the component at "
        "fault, a command that reproduces one)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="list every combination, even when they do not fit one screen",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


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


def _python(args: argparse.Namespace) -> str | None:
    """The Python version ``--python`` names: a version as given, an interpreter's asked."""
    from envbuilder.consumer.interpreter import interpreter_version, parse_python

    if not args.python:
        return None
    request = parse_python(args.python)
    return request.version or interpreter_version(request.path)  # type: ignore[arg-type]


def _interpreter(args: argparse.Namespace) -> tuple[Interpreter | None, str]:
    """``--here``: the user's interpreter and the line that names it (none found is said,
    and no Python is then assumed)."""
    from envbuilder.consumer.interpreter import choose, parse_python
    from envbuilder.errors import MissingToolError

    try:
        chosen = choose(parse_python(args.python) if args.python else None)
    except MissingToolError as e:
        return None, f"interpreter: none ({e}); judged for every Python"
    return chosen, f"interpreter: {chosen.describe()}"


def _query(args: argparse.Namespace, host: Host | None) -> Query:
    from envbuilder.consumer.query import Query

    gpu = args.gpu
    if gpu is None and host is not None and host.gpus:
        gpu = host.gpus[0].compute_capability or host.gpus[0].name
    return Query(
        gpu_name=args.gpu or (host.gpus[0].name if host is not None and host.gpus else None),
        no_gpu=host is not None and not host.gpus and args.gpu is None,
        suggest=True,
        python=(host.python or None) if host is not None else _python(args),
        cuda=args.cuda,
        torch=args.torch,
        xformers=args.xformers,
        gpu=gpu,
        use=args.use,
        arch=args.arch or (host.arch if host else None),
        driver=args.driver or (host.driver if host else None),
        os=(host.os or None) if host else None,
    )


def _lockfile_json(
    args: argparse.Namespace, path: Path, lock: CompatLock, now: datetime
) -> dict[str, object]:
    """Which lockfile answered (its path; the URL it came from, without a password; whether it
    is the snapshot this envbuilder carries) and how old its newest evidence is."""
    from datetime import date

    from envbuilder.consumer.published import is_url
    from envbuilder.consumer.snapshot import is_carried, newest_evidence
    from envbuilder.credentials import redact_text

    url = args.lock if args.lock and is_url(args.lock) else None
    if args.lock is None and args.settings.lockfile is None and args.settings.lock_url:
        url = args.settings.lock_url
    day = newest_evidence(lock)
    return {
        "path": str(path),
        "url": redact_text(url) if url else None,
        "carried": is_carried(path),
        "newest_evidence": day,
        "age_days": (now.date() - date.fromisoformat(day)).days if day else None,
    }


def _match_json(m: Match, now: datetime) -> dict[str, object]:
    from envbuilder.consumer.advice import action, advisory_line, causes, dated, verdict_date

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


def _advisory_lines(
    m: Match, *, indent: str = "    ", long: bool = False, width: int = SCREEN_COLUMNS
) -> list[str]:
    """Each advisory of *m*'s verdict on one line (a library the row does not pin); with
    *long*, its causes (who is at fault, by which experiment) and who is hit under it."""
    from envbuilder.consumer.advice import advisories, advisory_line, cause_line, causes

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
    from envbuilder.consumer.advice import advisories, advisory_line

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
    from envbuilder.consumer.advice import cause_line, causes, dated

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
    from dataclasses import replace

    from envbuilder.consumer.advice import action, count_text
    from envbuilder.consumer.query import replacement

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
    from envbuilder.consumer.advice import advisories

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
        said = "not verified on any GPU"
    return f"  [{said}]"


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
    import textwrap

    from envbuilder.consumer.advice import column_widths, one_line

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


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.host import detect_host
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.consumer.query import answer
    from envbuilder.lockfile.gpus import gpu_arch
    from envbuilder.lockfile.read import load_lockfile

    now = datetime.now(UTC)
    path, source = lockfile_choice(args.lock, args.settings)
    if source:  # on stderr: stdout stays one screen (or JSON)
        print(_wrapped(source, _screen()[0]), file=sys.stderr)
    lock = load_lockfile(path)
    chosen, chosen_line = _interpreter(args) if args.here else (None, "")
    host = detect_host(python=chosen.version if chosen else "") if args.here else None
    query = _query(args, host)
    result = answer(lock, query)
    if args.id is not None:
        result = _only(result, args.id, lock.by_id())
    matches = result.matches
    # rejections are news when the host decides them (a Grace GPU implies aarch64) or when
    # nothing matched; a plain filter's misses are not
    host_query = bool(args.here or args.arch or args.driver or gpu_arch(args.gpu or ""))
    if args.json:
        out = {
            "lockfile": _lockfile_json(args, path, lock, now),
            "interpreter": None
            if chosen is None
            else {
                "executable": str(chosen.executable),
                "version": chosen.version,
                "chosen_by": chosen.source,
            },
            "host": None if host is None else asdict(host),
            "query": asdict(query),
            "matches": [_match_json(m, now) for m in matches],
            "rejected": [{"id": r.entry.id, "reasons": list(r.reasons)} for r in result.rejected],
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if matches else 1
    width, height = _screen()
    head: list[str] = []
    if host is not None:
        head += _wrapped(chosen_line, width).splitlines()  # its reason whole, not cut
        head.append(f"this machine: {host.describe()}")
        given = [
            f"--{k} {v}"
            for k, v in (
                ("arch", args.arch),
                ("gpu", args.gpu),
                ("driver", args.driver),
            )
            if v
        ]
        if given:
            head.append(f"overridden: {' '.join(given)}")
        if len({g.compute_capability for g in host.gpus}) > 1:
            head.append(f"judged for the first GPU, {host.gpus[0].name}")
    tail = _warning_lines(matches) if args.id is None else []
    if query.no_gpu:
        tail += _gpu_summary(lock)
    if (host_query or not matches) and result.rejected:
        tail.append(
            f"{'not for this host' if host_query else 'not matching'} ({len(result.rejected)}):"
        )
        reason_lines = _rejection_lines(result, everything=args.all)
        room = max(height // 4, 2)
        if args.all or len(reason_lines) <= room:
            tail += reason_lines
        else:
            tail += reason_lines[: room - 1]
            tail.append(f"  … {len(reason_lines) - room + 1} more (--all lists them)")
    if not matches:
        print(fit(f"no combination in {path} matches", width), file=sys.stderr)
    body: list[str] = []
    if matches and args.id is not None:
        body = _one_combination(lock, matches[0], args.use, now, width)
        room = max(height - len(head) - len(tail), 4)
        if not args.all and len(body) > room:
            cut = len(body) - room + 1
            said = (
                f"… {cut} more lines: --use USE narrows, --all shows them, --json holds everything"
            )
            body = [*body[: room - 1], said]
    elif matches:
        body = render(
            result,
            use=args.use,
            now=now,
            long=args.long,
            everything=args.all,
            width=width,
            height=max(height - len(head) - len(tail), 4),
        )
    print("\n".join(fit(line, width) for line in head + body + tail))
    return 0 if matches else 1


def _screen() -> tuple[int, int]:
    """The terminal's width, and the lines one answer may take: at most `SCREEN_LINES`
    (`SCREEN_COLUMNS` wide where output is not a terminal)."""
    from envbuilder.reporter import terminal_size

    size = terminal_size(SCREEN_COLUMNS, SCREEN_LINES)
    return max(size.columns, 40), max(min(size.lines, SCREEN_LINES), 10)


def _warning_lines(matches: tuple[Match, ...]) -> list[str]:
    """Each warning once, with how many listed rows it concerns, then the rules' sources."""
    from envbuilder.lockfile.drivers import COMPATIBILITY_SOURCE, DRIVER_SOURCE

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
    from envbuilder.lockfile.gpus import gpu_model, sm
    from envbuilder.lockfile.model import INSTALLABLE, VERDICT_RANK

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


def _only(result: Answer, combination: str, known: Mapping[str, object]) -> Answer:
    """*result* cut down to the combination *combination*; an unknown id is bad input."""
    from dataclasses import replace

    from envbuilder.errors import InputError

    if combination not in known:
        import difflib

        close = difflib.get_close_matches(combination, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InputError(f"no combination {combination!r} in the lockfile{hint}")
    return replace(
        result,
        matches=tuple(m for m in result.matches if m.entry.id == combination),
        rejected=tuple(r for r in result.rejected if r.entry.id == combination),
    )


def _wrapped(text: str, width: int) -> str:
    """A sentence on as many lines as *width* needs, broken between words."""
    import textwrap

    return "\n".join(
        textwrap.wrap(
            text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    )
