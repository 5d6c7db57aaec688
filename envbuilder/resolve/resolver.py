"""Resolve combinations: decide torch and xformers from the evidence, then lock the closure.

The resolver is split the way resolvelib splits one: `evidence` fetches
(index pages, core metadata through HTTP range requests — never a whole
wheel — and xformers' build record), memoised; `decisions` decides, as
pure functions returning values; `locker` locks the closure with uv and
writes the pylock and requirements files; this module only schedules. A
combination that cannot work is a result with a reason, not a crash.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from envbuilder.model import Combination, IndexSpec, ResolvedCombination
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.resolve.evidence import Evidence
from envbuilder.resolve.locker import LockSettings, SolvedClosures, lock_group

__all__ = ["ResolveSettings", "Resolver"]


@dataclass(frozen=True, kw_only=True)
class ResolveSettings:
    default_index_url: str
    locking: LockSettings
    jobs: int = 8
    closure_jobs: int = 16
    """uv resolutions at once. Each waits on the network far more than it computes, so
    every pairing's starts as soon as it is decided rather than queueing behind
    ``jobs``; `LockSettings.uv_downloads` keeps the connections they open together
    bounded."""


class Resolver:
    """Schedules the decisions and locks of combinations against the indexes a matrix declares."""

    def __init__(
        self,
        *,
        indexes: Mapping[str, IndexSpec],
        evidence: Evidence,
        settings: ResolveSettings,
        on_done: Callable[[ResolvedCombination, float], None] | None = None,
    ) -> None:
        self.indexes = indexes
        self.evidence = evidence
        self.settings = settings
        self.on_done = on_done
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def _done(self, d: Decision, result: ResolvedCombination) -> ResolvedCombination:
        if self.on_done is not None:
            with self._lock:
                started = self._started[d.combination.id]
            self.on_done(result, time.monotonic() - started)
        return result

    def _decide(self, combination: Combination) -> tuple[Decision, ResolvedCombination | None]:
        """Phase one: the decision, and the final answer when there is nothing to lock."""
        with self._lock:
            self._started[combination.id] = time.monotonic()
        d = decide(
            combination,
            self.evidence,
            indexes=self.indexes,
            default_index_url=self.settings.default_index_url,
        )
        if d.status == "decided":
            return d, None
        return d, self._done(d, d.result(d.status, d.reason))

    def resolve(self, combinations: Sequence[Combination]) -> list[ResolvedCombination]:
        """Resolve combinations; the result keeps the input order.

        Every decision starts at once (they share the memoised evidence);
        the combinations of one torch/xformers pairing (typically its Python
        versions) are locked together, by one uv resolution, as soon as the
        last of their decisions is made, while other decisions and the other
        pairings' resolutions proceed. Pairings that ask uv the same question
        share one answer. A pairing whose resolution fails is an error for its
        combinations only; what the others wrote stays.
        """
        if not combinations:
            return []
        pairings: dict[tuple[object, ...], list[Combination]] = {}
        for c in combinations:
            pairings.setdefault(_pairing_key(c), []).append(c)
        workers = max(1, min(self.settings.jobs, len(combinations)))
        closure_workers = max(1, min(self.settings.closure_jobs, len(pairings)))
        locking = self.settings.locking
        solved = SolvedClosures()
        answers: dict[str, ResolvedCombination] = {}
        deciders = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decide")
        lockers = ThreadPoolExecutor(max_workers=closure_workers, thread_name_prefix="lock")
        finished = False
        try:
            decisions: dict[Future[tuple[Decision, ResolvedCombination | None]], tuple[object, ...]]
            decisions = {
                deciders.submit(self._decide, c): key
                for key, members in pairings.items()
                for c in members
            }
            decided: dict[tuple[object, ...], list[tuple[Decision, ResolvedCombination | None]]]
            decided = {key: [] for key in pairings}

            def lock(
                outcomes: list[tuple[Decision, ResolvedCombination | None]],
            ) -> list[ResolvedCombination]:
                groups: dict[tuple[object, ...], list[Decision]] = {}
                results = [answer for _, answer in outcomes if answer is not None]
                for d, answer in outcomes:
                    if answer is None:
                        groups.setdefault(d.closure_key(), []).append(d)
                if len(groups) <= 1:
                    for g in groups.values():
                        results += lock_group(g, locking, self._done, solved)
                    return results
                # Groups of one pairing (another Python's requirements) lock side by side:
                # one waiting for the other's uv runs made it the last to finish.
                with ThreadPoolExecutor(len(groups), thread_name_prefix="lock-group") as pool:
                    for locked in pool.map(
                        lambda g: lock_group(g, locking, self._done, solved), groups.values()
                    ):
                        results += locked
                return results

            locks = []
            for future in as_completed(decisions):
                key = decisions[future]
                decided[key].append(future.result())
                if len(decided[key]) == len(pairings[key]):
                    order = {c.id: i for i, c in enumerate(pairings[key])}
                    outcomes = sorted(decided[key], key=lambda o: order[o[0].combination.id])
                    locks.append(lockers.submit(lock, outcomes))
            for done in locks:
                answers.update((r.id, r) for r in done.result())
            finished = True
        finally:
            # Interrupted (Ctrl-C): cancel what has not started and do not wait for the rest.
            for pool in (lockers, deciders):
                pool.shutdown(wait=finished, cancel_futures=not finished)
        return [answers[c.id] for c in combinations]


def _pairing_key(c: Combination) -> tuple[object, ...]:
    return (
        c.torch,
        c.xformers,
        c.cuda,
        c.torch_index,
        c.xformers_index,
        c.add_cuda_runtime,
        c.xformers_source,
        c.cuda_archs,
    )
