"""``envbuilder resolve``: matrix.toml -> resolution.json + a hash-pinned lock per combination."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuilder.commands._args import add_matrix_argument, add_selectors
from envbuilder.model import ResolvedCombination
from envbuilder.reporter import Reporter

if TYPE_CHECKING:
    from envbuilder.index.relay import UvRelay
    from envbuilder.model import Combination
    from envbuilder.resolve.matrix import Matrix
    from envbuilder.resolve.resolver import ResolveSettings

HELP = (
    "resolve matrix combinations into hash-pinned locks (pylock.<id>.toml, requirements.<id>.txt)"
)

_MARK = {"resolved": "✓", "unsatisfiable": "✕", "error": "!"}


#: combinations decided at once by default. Each decision mostly waits on range requests
#: (torch's metadata), and a pairing's uv run waits for its last decision: on the default
#: matrix 16 took 6.0-7.3 s against 6.6-7.9 s for 8 (cold, alternated, 6 runs each);
#: 24 took 7.1-7.8 s.
DECIDING_JOBS = 16


def configure(parser: argparse.ArgumentParser) -> None:
    add_selectors(parser)
    add_matrix_argument(parser)
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        default=Path("locks"),
        metavar="DIR",
        help="output directory (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="HTTP and uv cache (default: $ENVBUILDER_CACHE_DIR or the user cache)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use only what the cache holds; never touch the network",
    )
    parser.add_argument(
        "--upgrade",
        action="store_true",
        help="re-resolve every closure even where the lock's inputs are unchanged",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=DECIDING_JOBS,
        metavar="N",
        help="combinations decided at once; each torch/xformers pairing's uv resolution"
        " starts as soon as it is decided, up to 16 at once (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with the list `combinations` on stdout")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from envbuilder.errors import InputError
    from envbuilder.files import write_atomic
    from envbuilder.model import Resolution
    from envbuilder.resolve.matrix import load_matrix

    if args.jobs < 1:
        raise InputError(f"--jobs must be at least 1, not {args.jobs!r}")
    reporter = Reporter(verbose=args.verbose)
    matrix = load_matrix(args.matrix)
    selected = matrix.select(args.selectors)
    matrix.require_index_urls(selected)
    results, downloaded, requests_made = _resolve(args, matrix, selected, reporter)
    resolution_path = args.out / "resolution.json"
    resolution = Resolution(
        matrix=str(args.matrix),
        matrix_sha256=matrix.sha256,
        combinations=_kept_with_earlier(results, matrix, resolution_path, reporter),
    )
    write_atomic(resolution_path, json.dumps(resolution.to_json(), indent=2, sort_keys=True) + "\n")

    counts = {
        s: sum(1 for r in results if r.status == s) for s in ("resolved", "unsatisfiable", "error")
    }
    reporter.line(
        f"{counts['resolved']} resolved, {counts['unsatisfiable']} unsatisfiable, {counts['error']} error(s); "
        f"{downloaded / 1e6:.1f} MB in {requests_made} requests; wrote {resolution_path}"
    )
    reporter.summary(_markdown(results))
    if args.json:
        selected_doc = Resolution(
            matrix=str(args.matrix), matrix_sha256=matrix.sha256, combinations=tuple(results)
        )
        json.dump(selected_doc.to_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    return 1 if counts["error"] else 0


def _resolve(
    args: argparse.Namespace,
    matrix: Matrix,
    selected: Sequence[Combination],
    reporter: Reporter,
) -> tuple[list[ResolvedCombination], int, int]:
    """Resolve *selected* through one HTTP client, and a relay for uv in a process of its
    own (`RelayProcess`), with a progress line per combination: the results, then the bytes
    downloaded and requests made by both."""
    from envbuilder.index.relayproc import RelayProcess
    from envbuilder.resolve.evidence import IndexEvidence
    from envbuilder.resolve.resolver import Resolver

    cache_dir = args.cache_dir or args.settings.cache_dir
    progress = _Progress(reporter, total=len(selected))
    step_name = (
        f"resolve {len(selected)} of {len(matrix.combinations)} combinations from {args.matrix}"
    )
    options = {
        "cache_dir": cache_dir,
        "offline": args.offline,
        "max_workers": args.jobs,
        "credentials": matrix.credentials,
    }
    with args.settings.http_client(**options) as client:
        key = _memo_key(args, matrix, selected)
        kept = None if args.upgrade else _kept_answers(args, cache_dir, key, client, reporter)
        if kept is not None:
            with reporter.step(step_name), progress:
                for result in kept:
                    progress.done(result, None)
            return kept, 0, 0
        relay = RelayProcess(
            args.settings.http_client_options(**options),
            platforms=_platforms(selected),
            pythons={c.python for c in selected},
        )
        with relay:
            settings = _settings(args, matrix, cache_dir, relay)
            resolver = Resolver(
                indexes=dict(matrix.indexes),
                evidence=IndexEvidence(client),
                settings=settings,
                on_done=progress.done,
            )
            with reporter.step(step_name) as step, progress:
                try:
                    results = resolver.resolve(selected)
                except KeyboardInterrupt:
                    client.cancel()  # requests still in flight fail at their next step
                    raise
                if any(r.status == "error" for r in results):
                    step.fail()
        _keep_answers(args, cache_dir, key, client, _pages(client, relay), results, reporter)
        return (
            results,
            client.bytes_downloaded + relay.bytes_downloaded,
            client.requests_made + relay.requests_made,
        )


def _platforms(selected: Sequence[Combination]) -> set[str]:
    """Every platform tag a wheel may carry to fit one of *selected*'s targets."""
    from envbuilder.resolve.decisions import target_of

    found = {"any"}
    for combination in selected:
        found.update(target_of(combination.python, combination.platform).platforms)
    return found


def _memo_key(args: argparse.Namespace, matrix: Matrix, selected: Sequence[Combination]) -> str:
    from envbuilder.resolve.closure import find_uv
    from envbuilder.resolve.memo import memo_key

    return memo_key(
        matrix_sha256=matrix.sha256,
        selected=[c.id for c in selected],
        index_url=args.settings.index_url,
        offline=args.offline,
        uv=str(find_uv()),
        environ=args.settings.environ,
    )


def _kept_answers(
    args: argparse.Namespace, cache_dir: Path, key: str, client: Any, reporter: Reporter
) -> list[ResolvedCombination] | None:
    """The answers an earlier run kept under *key* (`envbuilder.resolve.memo`), where every
    page it read still holds and no lock in --out differs; else None: decide again."""
    import time

    from envbuilder.resolve.memo import Memo

    memo = Memo.load(cache_dir, key)
    if memo is None:
        return None
    why = memo.usable(args.out, client.cache_entry, offline=args.offline, now=time.time())
    if why:
        reporter.detail(f"deciding again: {why}")
        return None
    answers = memo.answers(args.out)
    when = time.strftime("%H:%M:%S UTC", time.gmtime(memo.written))
    reporter.line(
        f"the answers of the run at {when}: every page it read is still fresh and unchanged"
        " (--upgrade decides again)"
    )
    return answers


def _pages(client: Any, relay: Any) -> dict[str, float | None]:
    """The pages the run read, the deciding client's and the relay's (for a URL both read,
    the sooner end of freshness); none when the relay could not say which it read."""
    if relay.pages_read is None:
        return {}  # nothing vouches for what uv was told: the answers are not kept
    pages: dict[str, float | None] = client.pages_read()
    for url, until in relay.pages_read.items():
        if url not in pages:
            pages[url] = until
        elif pages[url] is not None:
            pages[url] = None if until is None else min(pages[url], until)
    return pages


def _keep_answers(
    args: argparse.Namespace,
    cache_dir: Path,
    key: str,
    client: Any,
    pages: dict[str, float | None],
    results: Sequence[ResolvedCombination],
    reporter: Reporter,
) -> None:
    from envbuilder.resolve.memo import Memo

    memo = Memo.of_run(key, results, args.out, pages, client.cache_entry)
    problem = memo.save(cache_dir) if memo is not None else ""
    if problem:
        reporter.line(f"note: {problem}")


def _settings(
    args: argparse.Namespace, matrix: Matrix, cache_dir: Path, relay: UvRelay
) -> ResolveSettings:
    """The resolver's settings: the options, the matrix's suite and credentials, and the
    relay uv reaches the indexes through."""
    from envbuilder.resolve.closure import find_uv
    from envbuilder.resolve.locker import LockSettings
    from envbuilder.resolve.resolver import ResolveSettings

    return ResolveSettings(
        default_index_url=args.settings.index_url,
        jobs=args.jobs,
        locking=LockSettings(
            out_dir=args.out,
            cache_dir=cache_dir,
            uv=find_uv(),
            python=sys.executable,
            offline=args.offline,
            upgrade=args.upgrade,
            suite=matrix.suite.requirements,
            ca_bundle=args.settings.ca_bundle,
            credentials=args.settings.credentials.merged(matrix.credentials),
            relay=relay,
        ),
    )


def _kept_with_earlier(
    results: Sequence[ResolvedCombination],
    matrix: Matrix,
    resolution_path: Path,
    reporter: Reporter,
) -> tuple[ResolvedCombination, ...]:
    """This run's answers, in the matrix's order, beside the earlier answers of combinations
    not selected this time (still in the matrix); an error is no answer: it never replaces
    an earlier one (the index may be down)."""
    from envbuilder.errors import InputError
    from envbuilder.model import load_resolution

    previous: dict[str, ResolvedCombination] = {}
    if resolution_path.exists():
        try:
            previous = load_resolution(resolution_path).by_id()
        except InputError as e:
            reporter.line(f"note: not keeping earlier results: {e}")
    fresh = {r.id: r for r in results}
    for cid, result in list(fresh.items()):
        earlier = previous.get(cid)
        if result.status == "error" and earlier is not None and earlier.status != "error":
            reporter.line(f"note: {cid}: kept the earlier {earlier.status} answer after this error")
            del fresh[cid]
    return tuple(
        fresh.get(c.id) or previous[c.id]
        for c in matrix.combinations
        if c.id in fresh or c.id in previous
    )


class _Progress:
    """One line per finished combination (and the rejections with -v); on a terminal,
    a live bar with the counts by status below those lines."""

    def __init__(self, reporter: Reporter, *, total: int) -> None:
        self.reporter = reporter
        self.total = total
        self.count = 0
        self.counts = {"resolved": 0, "unsatisfiable": 0, "error": 0}
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.reporter.interactive:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            console = Console(file=self.reporter.stream)
            self._bar = Progress(
                TextColumn("resolving"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self._counts(), total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _counts(self) -> str:
        return ", ".join(f"{n} {status}" for status, n in self.counts.items())

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.reporter.line(text)

    def done(self, result: ResolvedCombination, seconds: float | None) -> None:
        """*seconds*: how long deciding took; None for an answer kept from an earlier run."""
        with self._lock:
            self.count += 1
            self.counts[result.status] += 1
            width = len(str(self.total))
            head = f"[{self.count:>{width}}/{self.total}] {_MARK[result.status]} {result.id}"
            took = "kept" if seconds is None else f"{seconds:.1f}s"
            self._line(f"{head}  {result.status} ({took}): {result.reason}")
            for note in result.notes:
                self._line(f"      note: {note}")
            if self.reporter.verbose:
                for rejection in result.rejected:
                    self._line(f"      rejected {rejection.filename}: {rejection.reason}")
            if self._bar is not None:
                self._bar.update(self._task, advance=1, description=self._counts())


def _markdown(results: Sequence[ResolvedCombination]) -> str:
    rows = ["| combination | status | reason |", "|---|---|---|"]
    for r in results:
        rows.append(f"| `{r.id}` | {r.status} | {r.reason.replace('|', '/')} |")
    return "\n".join(rows)
