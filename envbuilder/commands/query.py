"""``envbuilder query``: the lockfile's combinations that match, best first.

Every answer fits one screen (`SCREEN_LINES` lines of at most `SCREEN_COLUMNS`
characters): one line per combination (`advice.one_line`); ``--long`` or a combination's
id adds its failing checks grouped by cause; ``--json`` holds everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from envbuilder.commands._lockfile_args import add_lock_argument, add_selection_arguments

if TYPE_CHECKING:
    from envbuilder.lockfile.host import Host
    from envbuilder.lockfile.interpreter import Interpreter
    from envbuilder.lockfile.model import CompatLock, LastVerified, Use
    from envbuilder.lockfile.query import Answer, Match, Query

#: what one answer may take: a terminal's screen
SCREEN_LINES = 40
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
        help="the host's NVIDIA driver version, e.g. 550.54.15: combinations whose CUDA "
        "release needs a newer one are rejected",
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
    from envbuilder.lockfile.interpreter import interpreter_version, parse_python

    if not args.python:
        return None
    request = parse_python(args.python)
    return request.version or interpreter_version(request.path)  # type: ignore[arg-type]


def _interpreter(args: argparse.Namespace) -> tuple[Interpreter | None, str]:
    """``--here``: the user's interpreter and the line that names it (none found is said,
    and no Python is then assumed)."""
    from envbuilder.errors import MissingToolError
    from envbuilder.lockfile.interpreter import choose, parse_python

    try:
        chosen = choose(parse_python(args.python) if args.python else None)
    except MissingToolError as e:
        return None, f"interpreter: none ({e}); judged for every Python"
    return chosen, f"interpreter: {chosen.describe()}"


def _query(args: argparse.Namespace, host: Host | None) -> Query:
    from envbuilder.lockfile.query import Query

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
    )


def _match_json(m: Match, now: datetime) -> dict[str, object]:
    from envbuilder.lockfile.advice import action, causes, dated, verdict_date

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


def _detail(m: Match, now: datetime, *, indent: str = "    ") -> list[str]:
    """Under a combination's line: its date, then each failing cause on one line."""
    from envbuilder.lockfile.advice import cause_line, causes, dated

    cc = m.compute_capability
    lines = [f"{indent}{dated(m.entry, m.verdict, now, cc, m.use)}"]
    width = SCREEN_COLUMNS - len(indent)
    lines += [f"{indent}{cause_line(c, width)}" for c in causes(m.entry, m.verdict, cc)]
    others = [o.workaround for o in m.verdict.options if o.workaround not in m.verdict.workarounds]
    if others:
        lines.append(f"{indent}also verified on some of these checks: {', '.join(others)}")
    return lines


def _one_combination(lock: CompatLock, match: Match, use: Use | None, now: datetime) -> list[str]:
    """``query ID``: per use (or for *use* only) the line, its date and its causes."""
    from dataclasses import replace

    from envbuilder.lockfile.advice import action, count_text
    from envbuilder.lockfile.query import replacement

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
        lines += _detail(per_use, now)
    return lines


def _has_detail(m: Match) -> bool:
    """Whether ``--long`` has more to say about *m* than its line: its failing causes, or the
    stale evidence of a combination whose lock moved since its runs."""
    if m.verdict.verdict in ("verified", "unsatisfiable"):
        return False
    return m.verdict.verdict != "unverified" or (
        not m.entry.runs and m.entry.last_verified is not None
    )


def _with_evidence(line: str, m: Match) -> str:
    """*line* and, for a GPU, where the combination was verified (or "untested")."""
    if m.compute_capability is None or m.verdict.verdict == "unsatisfiable":
        return line
    said = m.evidence.text if m.evidence is not None else "untested on any GPU"
    if m.evidence is None and m.entry.gpus:
        said = "not verified on any GPU"
    return f"{line}  [{said}]"


def render(
    answer: Answer,
    *,
    use: Use | None,
    now: datetime,
    long: bool = False,
    everything: bool = False,
) -> list[str]:
    """The matches of *answer*, one line each, within one screen unless *everything*:
    combinations with no results at all are counted rather than listed, then the rest is
    cut with a line saying how to see it."""
    from envbuilder.lockfile.advice import column_widths, one_line

    matches = list(answer.matches)
    lines = [
        f"verdicts for {use}:" if use else "verdicts (the worst of the four uses):",
    ]
    lines[0] += (
        " verdict, combination, failing gate checks, age of the newest run counted "
        f"(now {now:%Y-%m-%d}), what to do"
    )
    silent = [
        m
        for m in matches
        if not m.entry.runs and m.entry.last_verified is None and m.verdict.verdict == "unverified"
    ]
    budget = SCREEN_LINES - 2  # the header and one line for what is left out
    shown = matches
    if not everything and len(matches) * (1 + 4 * long) > budget and silent:
        shown = [m for m in matches if m not in silent]
    widths = column_widths(shown, now)
    body: list[str] = []
    cut = 0
    for i, m in enumerate(shown):
        block = [_with_evidence(one_line(m, now, **widths), m)]
        if m.suggestion:
            block.append(f"    ↳ {m.suggestion}")
        if long and _has_detail(m):
            block += _detail(m, now)
        if not everything and len(body) + len(block) > budget - (1 if shown is not matches else 0):
            cut = len(shown) - i
            break
        body += block
    lines += body
    notes = []
    if shown is not matches:
        notes.append(f"{len(silent)} more with no results yet")
    if cut:
        notes.append(f"{cut} more not shown")
    if notes:
        lines.append(
            f"… {', '.join(notes)}: narrow with --python/--cuda/--torch/--gpu, or list all with --all"
        )
    return [line[:SCREEN_COLUMNS] for line in lines]


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.gpus import gpu_arch
    from envbuilder.lockfile.host import detect_host
    from envbuilder.lockfile.published import lockfile_choice
    from envbuilder.lockfile.query import answer
    from envbuilder.lockfile.read import load_lockfile

    now = datetime.now(UTC)
    path, source = lockfile_choice(args.lock, args.settings)
    if source:
        print(source, file=sys.stderr)  # stdout stays one screen (or JSON)
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
        listed = [_match_json(m, now) for m in matches]
        if host_query:
            out: object = {
                "interpreter": None
                if chosen is None
                else {
                    "executable": str(chosen.executable),
                    "version": chosen.version,
                    "chosen_by": chosen.source,
                },
                "host": None if host is None else asdict(host),
                "query": asdict(query),
                "matches": listed,
                "rejected": [
                    {"id": r.entry.id, "reasons": list(r.reasons)} for r in result.rejected
                ],
            }
        else:
            out = listed
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if matches else 1
    if host is not None:
        print(chosen_line)
        print(f"this machine: {host.describe()}")
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
            print(f"overridden: {' '.join(given)}")
        if len({g.compute_capability for g in host.gpus}) > 1:
            print(f"judged for the first GPU, {host.gpus[0].name}")
    if matches and args.id is not None:
        print("\n".join(_one_combination(lock, matches[0], args.use, now)))
    elif matches:
        print("\n".join(render(result, use=args.use, now=now, long=args.long, everything=args.all)))
    else:
        print(f"no combination in {path} matches", file=sys.stderr)
    warned = _warning_lines(matches) if args.id is None else []
    if warned:
        print("\n".join(warned))
    if query.no_gpu:
        print("\n".join(_gpu_summary(lock)))
    if (host_query or not matches) and result.rejected:
        print(f"{'not for this host' if host_query else 'not matching'} ({len(result.rejected)}):")
        reason_lines = _rejection_lines(result, everything=args.all)
        shown = reason_lines if args.all else reason_lines[: SCREEN_LINES // 2]
        for line in shown:
            print(line[:SCREEN_COLUMNS])
        if len(shown) < len(reason_lines):
            print(f"  … {len(reason_lines) - len(shown)} more lines (--all lists them)")
    return 0 if matches else 1


def _warning_lines(matches: tuple[Match, ...]) -> list[str]:
    """Each warning once, with how many listed rows it concerns, then the rules' sources."""
    from envbuilder.lockfile.drivers import COMPATIBILITY_SOURCE, DRIVER_SOURCE

    counts: dict[str, int] = {}
    for m in matches:
        for warning in m.warnings:
            counts[warning] = counts.get(warning, 0) + 1
    if not counts:
        return []
    lines = [
        f"! {n} row{'s' if n != 1 else ''}: {warning}"[:SCREEN_COLUMNS]
        for warning, n in counts.items()
    ]
    lines.append(f"  rule: {COMPATIBILITY_SOURCE}"[:SCREEN_COLUMNS])
    lines.append(f"  full-support drivers: {DRIVER_SOURCE}"[:SCREEN_COLUMNS])
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
        lines.append(f"  {model} ({sm(cc)}): {len(ids)} verified: {shown}"[:SCREEN_COLUMNS])
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
