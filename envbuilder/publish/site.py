"""Rendering the site from a verified lockfile (pure functions) and writing it (`build_site`)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from importlib import resources
from pathlib import Path, PurePosixPath
from string import Template

from envbuilder.consumer.advice import (
    action,
    advisories,
    advisory_line,
    cause_line,
    causes,
    dated,
    use_counts,
)
from envbuilder.consumer.query import Match, Query, answer, replacement
from envbuilder.errors import InputError, OutputError
from envbuilder.files import write_atomic
from envbuilder.gpus import GPU_ARCH, GPU_COMPUTE_CAPABILITY
from envbuilder.lockfile.model import (
    INSTALLABLE,
    USES,
    VERDICTS,
    CompatLock,
    Entry,
    Use,
    Verdict,
    use_verdict,
)
from envbuilder.lockfile.read import load_lockfile
from envbuilder.publish.plots import (
    COMPILE_KEYS,
    MEMORY_KEYS,
    TIME_KEYS,
    benchmarks,
    natural_key,
    svg_chart,
)

__all__ = ["build_site", "html_page", "markdown_table", "picker_data"]

SYMBOL = {
    "verified": "✅",
    "verified-with-workaround": "🟡",
    "xformers-unusable": "🔁",
    "unverified": "⬜",
    "broken": "❌",
    "unsatisfiable": "⛔",
}


def _asset(name: str) -> str:
    return resources.files("envbuilder.publish").joinpath(name).read_text(encoding="utf-8")


#: Characters that start Markdown inline syntax (emphasis, code, links, strikethrough), a
#: table cell's end, or an escape; each is written backslash-escaped.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]~|])")


def _md(text: str) -> str:
    """*text* (from results files, the resolver, file names) as literal Markdown table text:
    raw HTML becomes entities, Markdown syntax is escaped, line breaks become spaces."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def _code(text: str) -> str:
    """*text* as a code span in a table cell, or as escaped text where a span cannot hold it."""
    if "`" in text or len(text.splitlines()) > 1:
        return _md(text)
    return "`" + text.replace("|", "\\|") + "`"


def _gpus_text(entry: Entry) -> str:
    parts = []
    for g in entry.gpus:
        flag = " ⚠ conflicting results" if g.conflict else ""
        parts.append(f"{g.gpu.replace('NVIDIA ', '')}: {g.verdict.verdict}{flag}")
    return "; ".join(parts) or "–"


def _uses_text(entry: Entry) -> str:
    return " ".join(f"{u.use} {SYMBOL[u.verdict.verdict]}" for u in entry.uses)


def _verified_uses(entry: Entry) -> list[str]:
    return [u.use for u in entry.uses if u.verdict.verdict in INSTALLABLE]


def _advice(lock: CompatLock, entry: Entry, use: Use | None, now: datetime) -> str:
    """The verdict's one action and its date, as `query` says them."""
    verdict = entry.verdict if use is None else use_verdict(entry.uses, use)
    alternative = replacement(lock, entry, use) if verdict.verdict == "xformers-unusable" else None
    return f"{action(verdict, alternative)} ({dated(entry, verdict, now, use=use)})"


def _per_use_sections(lock: CompatLock, now: datetime) -> list[str]:
    """Per combination with runs and per use that is not plainly verified: the verdict, the
    one action, its date, and the failing checks grouped by cause."""
    lines: list[str] = []
    for e in lock.combinations:
        if not e.runs:
            continue
        for u in e.uses:
            if u.verdict.verdict == "verified":
                continue
            lines += [  # its failing checks are this use's own, never a union over uses
                "",
                f"**{_md(e.id)}**, {u.use}: {SYMBOL[u.verdict.verdict]} {u.verdict.verdict}: "
                f"{_md(_advice(lock, e, u.use, now))}",
            ]
            lines += [f"- {_md(cause_line(c))}" for c in causes(e, u.verdict)]
        for u in e.uses:  # libraries the row does not pin: their own verdicts, apart
            lines += [
                f"- advisory, {u.use}: {_md(advisory_line(e, a, width=400))}"
                for a in advisories(u.verdict)
            ]
    return (["", "### Per use: what to do and why", *lines]) if lines else []


def _source_build_section(lock: CompatLock) -> list[str]:
    """Combinations whose xformers is built from source: the measured build, or how to make one."""
    from envbuilder.lockfile.sourcebuilds import describe

    lines = [
        f"- {_code(e.id)}: {_md(describe(e.source_build, e.id))}"
        for e in lock.combinations
        if e.source_build is not None
    ]
    return ["", "### Built from source", "", *lines] if lines else []


def markdown_table(lock: CompatLock, content_sha256: str, now: datetime | None = None) -> str:
    """The lockfile as a Markdown table (README, GitHub step summary)."""
    now = now or datetime.now(UTC)
    counts = Counter(e.verdict.verdict for e in lock.combinations)
    lines = [
        "## Compatibility (envbuilder)",
        "",
        f"Generated by `nox -s publish` from `compat.lock.json` (content_sha256 `{content_sha256[:16]}…`). "
        + ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v]),
        "",
        "| Combination | Python | CUDA | torch | xformers | Verdict | Per use | GPUs | What to do |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in lock.combinations:
        v = e.verdict
        lines.append(
            f"| {_code(e.id)} | {_md(e.python)} | {_md(e.cuda)} | {_md(e.torch or '–')} | "
            f"{_md(e.xformers or '–')} | {SYMBOL[v.verdict]} {v.verdict} | {_uses_text(e)} | "
            f"{_md(_gpus_text(e))} | {_md(_advice(lock, e, None, now))} |"
        )
    lines += _per_use_sections(lock, now)
    lines += _source_build_section(lock)
    if lock.rejected_results:
        lines += ["", "Rejected results files:", ""]
        lines += [f"- {_code(r.file)}: {_md(r.reason)}" for r in lock.rejected_results]
    return "\n".join(lines) + "\n"


def _cc(cc: str | None) -> str:
    return "sm_" + cc.replace(".", "") if cc else "cpu"


def _select(key: str, label: str, options: list[tuple[str, str]]) -> str:
    opts = "".join(f'<option value="{escape(v)}">{escape(t)}</option>' for v, t in options)
    return (
        f'<label>{escape(label)} <select class="filter" id="filter-{key}" data-key="{key}">'
        f'<option value="">any</option>{opts}</select></label>'
    )


def _versions(values: Sequence[str]) -> list[str]:
    """*values* sorted as versions (3.9 before 3.10, cu121 before cu130), each once."""
    return sorted(set(values), key=natural_key)


def _cuda_values(entry: Entry) -> list[str]:
    values = [entry.cuda]
    if entry.torch_build is not None and entry.torch_build.cuda is not None:
        values.append(entry.torch_build.cuda.tag)
    return sorted(set(values))


def _stale(entry: Entry) -> str:
    """The age of the evidence, while the current lock has no runs of its own."""
    last = entry.last_verified
    if last is None or entry.runs:
        return ""
    return (
        f'<span class="last-verified" title="suite {escape(last.suite_version)}, lock '
        f'{escape(last.lock_sha256 or "none")}">{escape(last.describe())}</span>'
    )


def _use_title(lock: CompatLock, entry: Entry, use: Use, now: datetime) -> str:
    verdict = use_verdict(entry.uses, use)
    lines = [_advice(lock, entry, use, now), *(cause_line(c) for c in causes(entry, verdict))]
    return "\n".join(lines)


def _row(
    lock: CompatLock, entry: Entry, gpu_columns: list[tuple[str, str | None]], now: datetime
) -> str:
    v = entry.verdict
    ccs = sorted({_cc(g.compute_capability) for g in entry.gpus})
    advice = _advice(lock, entry, None, now)
    cells = [
        f'<td class="id">{escape(entry.id)}</td>',
        f'<td class="verdict v-{v.verdict}">{escape(v.verdict)}{_stale(entry)}'
        f'<span class="reason" title="{escape(advice)}">{escape(advice)}</span>'
        f"{_causes_details(entry, v)}</td>",
        f'<td class="python">{escape(entry.python)}</td>',
        f'<td class="cuda">{escape(" / ".join(_cuda_values(entry)))}</td>',
        f'<td class="torch">{escape(entry.torch or "–")}</td>',
        f'<td class="xformers">{escape(entry.xformers or "–")}</td>',
    ]
    for u in entry.uses:
        cells.append(
            f'<td class="use v-{u.verdict.verdict}" data-use="{u.use}" '
            f'title="{escape(_use_title(lock, entry, u.use, now))}">{escape(u.verdict.verdict)}</td>'
        )
    gpus = []
    for name, cc in gpu_columns:
        mine = [g for g in entry.gpus if (g.gpu, g.compute_capability) == (name, cc)]
        if not mine:
            continue
        g = mine[0]
        flag = (
            ' <span class="conflict" title="runs disagree">⚠ conflict</span>' if g.conflict else ""
        )
        runs = f"{len(g.runs)} run{'s' if len(g.runs) != 1 else ''}"
        gpus.append(
            f'<span class="gpu-run v-{g.verdict.verdict}" title="{escape(g.verdict.reason)}">'
            f"{escape(name.replace('NVIDIA ', ''))} {_cc(cc)}: {escape(g.verdict.verdict)} "
            f"({runs}){flag}</span>"
        )
    cells.append(f'<td class="gpu">{"".join(gpus) or "–"}</td>')
    if v.verdict in INSTALLABLE and entry.lock is not None:
        cells.append(
            '<td class="install"><details><summary>install</summary>'
            f'<code class="cmd">envbuilder install {escape(entry.id)}</code><br>'
            f'<code class="cmd">envbuilder export {escape(entry.id)} -o pylock.toml '
            f"&amp;&amp; uv pip install -r pylock.toml</code> "
            f'(<a href="{escape(entry.lock.path)}">download</a>)</details></td>'
        )
    else:
        cells.append('<td class="install">–</td>')
    attrs = (
        f'class="combo" data-filtered data-id="{escape(entry.id)}" '
        f'data-python="{escape(entry.python)}" data-cuda="{escape(" ".join(_cuda_values(entry)))}" '
        f'data-gpu="{escape(" ".join(ccs))}" data-verdict="{v.verdict}" '
        f'data-uses="{" ".join(_verified_uses(entry))}"'
    )
    return f"<tr {attrs}>{''.join(cells)}</tr>"


def _causes_details(entry: Entry, verdict: Verdict) -> str:
    """The failing checks grouped by cause, folded: a row stays one glance tall however
    many checks failed. The summary counts the worst use's checks (never a union over uses)
    and says how many advisories of libraries the row does not pin follow the causes."""
    found = causes(entry, verdict)
    said = [a for a in advisories(verdict)]
    if not found and not said:
        return ""
    parts = []
    if found:
        checks = use_counts(entry.uses)
        parts.append(
            f"{checks} failing in the worst use, {len(found)} cause{'s' if len(found) != 1 else ''}"
        )
    if said:
        parts.append(f"{len(said)} advisor{'ies' if len(said) != 1 else 'y'}")
    lines = "".join(f"<li>{escape(cause_line(c))}</li>" for c in found)
    lines += "".join(
        f"<li>advisory: {escape(advisory_line(entry, a, width=400))}</li>" for a in said
    )
    summary = ", ".join(parts)
    return f'<details class="causes"><summary>{summary}</summary><ul>{lines}</ul></details>'


def _figure(entry: Entry) -> str:
    speed = svg_chart("speed", "ms", benchmarks(entry, TIME_KEYS))
    memory = svg_chart("peak memory", "MiB", benchmarks(entry, MEMORY_KEYS), kind="memory")
    if not speed and not memory:
        return ""
    return _figure_of(entry, speed + memory)


def _compile_figure(entry: Entry) -> str:
    chart = svg_chart(
        "first call under torch.compile, compiling included",
        "s",
        benchmarks(entry, COMPILE_KEYS, compile_time=True),
    )
    return _figure_of(entry, chart) if chart else ""


def _figure_of(entry: Entry, charts: str) -> str:
    ccs = " ".join(sorted({_cc(g.compute_capability) for g in entry.gpus}))
    return (
        f'<figure data-filtered data-python="{escape(entry.python)}" '
        f'data-cuda="{escape(" ".join(_cuda_values(entry)))}" data-gpu="{escape(ccs)}" '
        f'data-uses="{" ".join(_verified_uses(entry))}">'
        f"<figcaption>{escape(entry.id)}</figcaption>{charts}</figure>"
    )


#: How the picker names "any" in its keys.
ANY = ""


def _known_gpus(lock: CompatLock) -> list[tuple[str, str, str | None]]:
    """Every GPU the picker offers: (name, compute capability, the CPU architecture it
    implies), the table's models first by capability then the runners' other names."""
    gpus = [(name, cc, GPU_ARCH.get(name)) for name, cc in GPU_COMPUTE_CAPABILITY.items()]
    squashed = {re.sub(r"[\s_-]", "", n).upper() for n in GPU_COMPUTE_CAPABILITY}
    for e in lock.combinations:
        for g in e.gpus:
            name = g.gpu.replace("NVIDIA ", "")
            key = re.sub(r"[\s_-]", "", name).upper()
            if g.compute_capability and not any(k in key for k in squashed):
                gpus.append((name, g.compute_capability, None))
                squashed.add(key)
    return sorted(set(gpus), key=lambda g: (natural_key(g[1]), g[0]))


def _install_command(entry: Entry, use: Use | None) -> str:
    return f"envbuilder install {entry.id}" + (f" --use {use}" if use else "")


def picker_data(lock: CompatLock) -> dict[str, object]:
    """What the picker needs to answer in the browser without judging anything itself: per
    (compute capability, use) the combinations ranked by `query.answer`, with verdicts and
    reasons; per combination what the host must match (Python, CUDA, architecture, driver).
    The browser only drops the ones the chosen Python, CUDA, driver or GPU rule out."""
    reasons: list[str] = []
    index: dict[str, int] = {}

    def reason(text: str) -> int:
        if text not in index:
            index[text] = len(reasons)
            reasons.append(text)
        return index[text]

    ranked: dict[str, list[tuple[str, str, int]]] = {}
    ccs = sorted({cc for _, cc, _ in _known_gpus(lock)}, key=natural_key)
    for cc in [ANY, *ccs]:
        for use in [None, *USES]:
            matches: Sequence[Match] = answer(lock, Query(gpu=cc or None, use=use)).matches
            ranked[f"{cc}|{use or ANY}"] = [
                (m.entry.id, m.verdict.verdict, reason(m.verdict.reason)) for m in matches
            ]
    entries = {
        e.id: {
            "python": e.python,
            "cuda": e.cuda_release or "",
            "arch": e.arch,
            "driver": e.minimum_driver or "",
            "installable": e.installable,
        }
        for e in lock.combinations
    }
    return {"ranked": ranked, "entries": entries, "reasons": reasons}


def _picker(lock: CompatLock) -> str:
    entries = lock.combinations
    pythons = _versions([e.python for e in entries])
    cudas = _versions([e.cuda_release for e in entries if e.cuda_release])
    gpus = "".join(
        f'<option value="{escape(cc)}" data-arch="{escape(arch or "")}">'
        f"{escape(name)} ({_cc(cc)})</option>"
        for name, cc, arch in _known_gpus(lock)
    )

    def options(values: Sequence[str], label: str) -> str:
        return "".join(
            f'<option value="{escape(v)}">{escape(label.format(v))}</option>' for v in values
        )

    best = answer(lock, Query()).matches
    return (
        '<section id="picker" aria-label="what to install">'
        '<form id="pick" onsubmit="return false">'
        '<label>Python <select id="pick-python"><option value="">any</option>'
        f"{options(pythons, '{}')}</select></label>"
        '<label>CUDA <select id="pick-cuda"><option value="">any</option>'
        f"{options(cudas, 'CUDA {}')}</select></label>"
        '<label>or driver <input id="pick-driver" size="10" inputmode="decimal" '
        'placeholder="e.g. 550.54" autocomplete="off"></label>'
        f'<label>GPU <select id="pick-gpu"><option value="">any</option>{gpus}</select></label>'
        '<label>Use <select id="pick-use"><option value="">all four</option>'
        f"{options(list(USES), '{}')}</select></label>"
        "</form>"
        f'<div id="answer" aria-live="polite">{_answer_html(best[0] if best else None)}</div>'
        f"{_per_use_html(lock)}{_steps_html(best[0] if best else None)}"
        "</section>"
    )


#: How to get the CLI, as the README's first screen says it.
GET_CLI = ("uv tool install gpu-envbuilder", "pip install gpu-envbuilder")


def _per_use_html(lock: CompatLock) -> str:
    """The best installable combination for each use (the picker's JavaScript redoes it
    for the choices made)."""
    items = []
    for use in USES:
        fits = [m for m in answer(lock, Query(use=use)).matches if m.entry.lock is not None]
        best = fits[0] if fits else None
        verdict = best.verdict.verdict if best else "unsatisfiable"
        items.append(
            f'<li data-use="{use}"><span class="use-name">{use}</span> '
            f'<span class="verdict-badge v-{verdict}">'
            f"{escape(best.verdict.verdict if best else 'nothing fits')}</span> "
            f'<span class="uid">{escape(best.entry.id if best else "")}</span></li>'
        )
    return (
        '<div id="answer-per-use"><p class="meta">Per use (the best for each of the four):</p>'
        f'<ul id="answer-uses">{"".join(items)}</ul></div>'
    )


def _steps_html(match: Match | None) -> str:
    """The whole way from nothing to a checked environment: get the CLI, install, check."""
    command = _install_command(match.entry, None) if match is not None else "envbuilder query"
    return (
        '<ol id="answer-steps">'
        f"<li>get the CLI: <code>{GET_CLI[0]}</code> or <code>{GET_CLI[1]}</code></li>"
        '<li>with your project\'s venv active: <code id="step-install">'
        f"{escape(command)}</code></li>"
        "<li>check it: <code>envbuilder doctor</code></li>"
        '<li class="meta">the CLI answers from the lockfile it carries; for this page\'s '
        'add <code id="step-lock">--lock compat.lock.json</code> (its https URL) or set '
        "<code>ENVBUILDER_LOCK_URL</code> to it</li>"
        "</ol>"
    )


def _answer_html(match: Match | None) -> str:
    """The picker's answer before any choice (the page without JavaScript shows this)."""
    if match is None:
        return '<p class="answer-none">No combination in this lockfile.</p>'
    v = match.verdict
    command = (
        f'<code class="cmd" id="answer-cmd">{escape(_install_command(match.entry, None))}</code>'
        if v.verdict in INSTALLABLE and match.entry.lock is not None
        else '<p class="answer-none">Nothing verified: no install command to recommend.</p>'
    )
    return (
        f'<p class="answer-head"><span id="answer-verdict" class="verdict-badge v-{v.verdict}">'
        f'{escape(v.verdict)}</span> <span id="answer-id">{escape(match.entry.id)}</span></p>'
        f"{command}"
        f'<p id="answer-why" class="reason">{escape(v.reason)}</p>'
        '<p id="answer-more" class="meta"></p>'
    )


def html_page(lock: CompatLock, content_sha256: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    ordered = [m.entry for m in answer(lock, Query()).matches]  # verified first, newest first
    entries = lock.combinations
    gpu_columns = sorted({(g.gpu, g.compute_capability) for e in entries for g in e.gpus})
    gpu_names: dict[str, set[str]] = {}
    for name, cc in gpu_columns:
        gpu_names.setdefault(_cc(cc), set()).add(name.replace("NVIDIA ", ""))
    filters = "".join(
        [
            _select("python", "Python", [(p, p) for p in _versions([e.python for e in entries])]),
            _select(
                "cuda",
                "CUDA",
                [(c, c) for c in _versions([c for e in entries for c in _cuda_values(e)])],
            ),
            _select(
                "gpu",
                "GPU",
                [
                    (cc, f"{cc} ({', '.join(sorted(n))})")
                    for cc, n in sorted(gpu_names.items(), key=lambda i: natural_key(i[0]))
                ],
            ),
            _select("uses", "Verified for", [(u, u) for u in USES]),
        ]
    )
    counts = Counter(e.verdict.verdict for e in entries)
    use_headers = "".join(f'<th class="use">{escape(u)}</th>' for u in USES)
    headers = '<th class="gpu">GPUs measured</th>'
    legend = "".join(f'<span class="v-{v}">{v}</span>' for v in VERDICTS)
    plots = "".join(_figure(e) for e in ordered) or "<p>No performance numbers yet.</p>"
    compile_plots = (
        "".join(_compile_figure(e) for e in ordered) or "<p>No compile-time numbers yet.</p>"
    )
    data = json.dumps(picker_data(lock), sort_keys=True, separators=(",", ":"))
    return Template(_asset("page.html")).substitute(
        style=_asset("page.css"),
        script=_asset("page.js"),
        content_sha256=content_sha256,
        counts=escape(", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])),
        picker=_picker(lock),
        picker_data=data.replace("<", "\\u003c"),
        filters=filters,
        use_headers=use_headers,
        gpu_headers=headers,
        rows="\n".join(_row(lock, e, gpu_columns, now) for e in ordered),
        legend=legend,
        plots=plots,
        compile_plots=compile_plots,
    )


def build_site(lockfile: Path, out: Path) -> list[Path]:
    """Write the site into *out* (replaced as a whole, atomically); return the files written."""
    lock = load_lockfile(lockfile)
    raw = lockfile.read_bytes()
    content_sha256 = json.loads(raw)["content_sha256"]
    files: dict[str, bytes] = {
        "compat.lock.json": raw,
        "compat.schema.json": resources.files("envbuilder")
        .joinpath("schemas/compat.schema.json")
        .read_bytes(),
        "compat.md": markdown_table(lock, content_sha256).encode("utf-8"),
        "index.html": html_page(lock, content_sha256).encode("utf-8"),
    }
    for entry in lock.combinations:
        if entry.lock is None:
            continue
        rel = PurePosixPath(entry.lock.path)
        if rel.is_absolute() or ".." in rel.parts:
            raise InputError(
                f"{lockfile}: the lock of {entry.id!r} lies outside the lockfile's directory "
                f"({entry.lock.path!r}); write the lockfile beside its locks (e.g. the repository root)"
            )
        from envbuilder.consumer.export import carried, locate_pylock

        if carried(lockfile, entry):  # the wheel's snapshot: installed by name and sha256
            continue
        files[str(rel)] = locate_pylock(lockfile, entry).read_bytes()
    _refuse_foreign_directory(out)
    files[SITE_MARKER] = f"written by envbuilder publish; {content_sha256}\n".encode()
    try:
        _write_all(out, files)
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        raise OutputError(
            f"cannot write the site into {out} ({e.strerror or e}{where}); nothing was changed "
            f"({'the old site is intact' if out.exists() else 'no site was left behind'}): "
            "free some space or pass a writable --out"
        ) from e
    return [out / name for name in sorted(files)]


#: The file that marks a directory as a site envbuilder wrote, which ``publish`` may replace.
SITE_MARKER = ".envbuilder-site"


def _refuse_foreign_directory(out: Path) -> None:
    """Refuse to replace *out* unless it is absent, empty, or an earlier site (its marker):
    the site replaces the directory as a whole, and ``-o docs`` must not delete a user's files."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise InputError(
            f"--out {out} exists and is not a directory; nothing was changed: "
            "pass a new or empty directory"
        )
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as e:
        raise InputError(
            f"--out {out} cannot be listed ({e.strerror or e}); nothing was changed"
        ) from e
    if not entries or SITE_MARKER in entries:
        return
    shown = ", ".join(entries[:5]) + (f", … ({len(entries)} entries)" if len(entries) > 5 else "")
    raise InputError(
        f"--out {out} holds files that are not an envbuilder site ({shown}); publishing replaces "
        f"the directory as a whole, so nothing was changed: pass a new or empty directory, or "
        f"one written by `envbuilder publish` (it holds {SITE_MARKER})"
    )


def _write_all(out: Path, files: Mapping[str, bytes]) -> None:
    """Write every file into a staging directory beside *out*, then swap it in: readers see
    the old site or the new one, never a part, and any failure leaves *out* as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = out.parent / f"{staging.name}.old"
    try:
        for name, data in files.items():
            write_atomic(staging / name, data)
        had = out.exists()
        if had:
            out.replace(old)
        try:
            staging.replace(out)
        except BaseException:
            if had:
                old.replace(out)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
