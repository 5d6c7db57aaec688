"""The resolver's schedule: pairings' closures run at once, and nothing of that shows.

uv is replaced by a fake closure (a pure function of the requirements) whose
answers arrive in an order chosen by the test; the locks written, and the
order of the results, must not depend on it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.pylock import Pylock
from packaging.requirements import Requirement

from envbuilder.model import Combination, IndexSpec, ResolvedCombination
from envbuilder.resolve.closure import ClosureError
from envbuilder.resolve.locker import LockSettings
from envbuilder.resolve.resolver import Resolver, ResolveSettings
from envbuilder.target import CudaTag
from tests.support.evidence import DEFAULT, FakeEvidence, wheel

TORCHES = ("2.4.1", "2.5.1", "2.6.0", "2.7.0")
PYTHONS = ("3.10", "3.11")


def _dependency(torch: str) -> str:
    return f"dep-of-torch-{torch.replace('.', '-')}"


def _evidence() -> FakeEvidence:
    torch = [
        wheel("torch", v, f"cp{p.replace('.', '')}-cp{p.replace('.', '')}-manylinux_2_28_x86_64")
        for v in TORCHES
        for p in PYTHONS
    ]
    return FakeEvidence(
        files={"torch": torch, "xformers": []},
        requires={
            w.filename: ["nvidia-cuda-runtime-cu12==12.1.105", _dependency(str(w.version))]
            for w in torch
        },
        records={},
    )


def _combinations() -> list[Combination]:
    return [
        Combination(
            id=f"py{p}-cu121-torch{v}", python=p, cuda=CudaTag(12, 1), torch=v, xformers=None
        )
        for v in TORCHES
        for p in PYTHONS
    ]


def _closure(requirements: Sequence[str]) -> Pylock:
    """What uv would answer: each requirement at 1.0, as a py3-none-any wheel."""
    names = sorted({Requirement(r).name for r in requirements})
    return Pylock.from_dict(
        {
            "lock-version": "1.0",
            "created-by": "uv",
            "packages": [
                {
                    "name": n,
                    "version": "1.0",
                    "wheels": [
                        {
                            "url": f"{DEFAULT}/files/{n.replace('-', '_')}-1.0-py3-none-any.whl",
                            "size": 10,
                            "hashes": {"sha256": hashlib.sha256(n.encode()).hexdigest()},
                        }
                    ],
                }
                for n in names
            ],
        }
    )


class FakeUv:
    """Stands in for `compile_closure`: answers after ``delay(requirements)`` seconds,
    fails for the torch named in ``failing``, and records how many ran at once."""

    def __init__(self, delay: Callable[[str], float], failing: str | None = None) -> None:
        self.delay = delay
        self.failing = failing
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, *, requirements: Sequence[str], **_: Any) -> Pylock:
        torch = next(r for r in requirements if r.startswith("dep-of-torch-"))
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.delay(torch))
            if self.failing is not None and torch == _dependency(self.failing):
                raise ClosureError(f"uv could not resolve {torch}: no version of it exists")
            return _closure(requirements)
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[FakeUv, str], list[ResolvedCombination]]]:
    def run(uv: FakeUv, out: str) -> list[ResolvedCombination]:
        monkeypatch.setattr("envbuilder.resolve.locker.compile_closure", uv)
        settings = ResolveSettings(
            default_index_url=DEFAULT,
            jobs=2,
            locking=LockSettings(
                out_dir=tmp_path / out, cache_dir=tmp_path / f"cache-{out}", uv="uv"
            ),
        )
        resolver = Resolver(
            indexes={"default": IndexSpec(name="default", url=None)},
            evidence=_evidence(),
            settings=settings,
        )
        return resolver.resolve(_combinations())

    yield run


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_pairings_are_locked_at_once_and_the_order_of_answers_does_not_show(
    resolve: Callable[[FakeUv, str], list[ResolvedCombination]], tmp_path: Path
) -> None:
    first_fastest = FakeUv(lambda torch: 0.1 * (1 + sorted(map(_dependency, TORCHES)).index(torch)))
    last_fastest = FakeUv(lambda torch: 0.1 * (4 - sorted(map(_dependency, TORCHES)).index(torch)))
    one = resolve(first_fastest, "one")
    other = resolve(last_fastest, "other")
    assert [r.id for r in one] == [c.id for c in _combinations()] == [r.id for r in other]
    assert {r.status for r in one + other} == {"resolved"}
    assert first_fastest.most == last_fastest.most == len(TORCHES), (
        "one uv run per pairing, at once"
    )
    assert _tree(tmp_path / "one") == _tree(tmp_path / "other")
    assert len(_tree(tmp_path / "one")) == 2 * len(
        _combinations()
    )  # a pylock and requirements each


def test_one_failing_closure_is_that_pairing_s_error_and_the_others_are_written(
    resolve: Callable[[FakeUv, str], list[ResolvedCombination]], tmp_path: Path
) -> None:
    failing = "2.5.1"
    results = resolve(FakeUv(lambda torch: 0.02, failing=failing), "out")
    by_torch = {(r.id, r.status) for r in results}
    for c in _combinations():
        expected = "error" if c.torch == failing else "resolved"
        assert (c.id, expected) in by_torch
    errors = [r for r in results if r.status == "error"]
    assert all("uv could not resolve dep-of-torch-2-5-1" in r.reason for r in errors)
    written = _tree(tmp_path / "out")
    resolved = [r for r in results if r.status == "resolved"]
    assert len(written) == 2 * len(resolved)
    assert all(r.lock is not None and Path(r.lock).name in written for r in resolved)
