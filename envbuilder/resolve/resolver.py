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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from envbuilder.model import Combination, IndexSpec, ResolvedCombination
from envbuilder.resolve.decisions import Decision, decide
from envbuilder.resolve.evidence import Evidence
from envbuilder.resolve.locker import LockSettings, lock_group

__all__ = ["ResolveSettings", "Resolver"]


@dataclass(frozen=True, kw_only=True)
class ResolveSettings:
    default_index_url: str
    locking: LockSettings
    jobs: int = 8


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

        Combinations of one torch/xformers pairing (typically its Python
        versions) go through together: their decisions run in parallel, then
        one uv resolution locks them all, while other pairings proceed.
        """
        if not combinations:
            return []
        pairings: dict[tuple[object, ...], list[Combination]] = {}
        for c in combinations:
            pairings.setdefault(_pairing_key(c), []).append(c)
        workers = max(1, min(self.settings.jobs, len(combinations)))
        locking = self.settings.locking
        answers: dict[str, ResolvedCombination] = {}
        with (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decide") as deciders,
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lock") as lockers,
        ):

            def pairing(members: list[Combination]) -> list[ResolvedCombination]:
                decided = list(deciders.map(self._decide, members))
                groups: dict[tuple[object, ...], list[Decision]] = {}
                for d, answer in decided:
                    if answer is None:
                        groups.setdefault(d.closure_key(), []).append(d)
                locked = {
                    r.id: r for g in groups.values() for r in lock_group(g, locking, self._done)
                }
                return [answer or locked[d.combination.id] for d, answer in decided]

            for results in lockers.map(pairing, list(pairings.values())):
                answers.update((r.id, r) for r in results)
        return [answers[c.id] for c in combinations]


def _pairing_key(c: Combination) -> tuple[object, ...]:
    return (c.torch, c.xformers, c.cuda, c.torch_index, c.xformers_index, c.add_cuda_runtime)
