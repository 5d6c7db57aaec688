"""Sharing uv's answers between pairings that ask it the same question."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.pylock import Pylock

from envbuilder.pylock import read_lock
from envbuilder.resolve.closure import ClosureError
from envbuilder.resolve.locker import SolvedClosures

EMPTY = 'lock-version = "1.0"\ncreated-by = "uv"\npackages = []\n'


def test_one_question_is_asked_once_even_from_many_threads() -> None:
    solved, calls, gate = SolvedClosures(), [], threading.Event()

    def compute() -> Pylock:
        calls.append(1)
        gate.wait(5)
        return read_lock(EMPTY, source="t")

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(solved.solve, ("numpy",), compute) for _ in range(4)]
        gate.set()
        answers = [f.result() for f in futures]
    assert len(calls) == 1
    assert all(a is answers[0] for a in answers)


def test_different_questions_are_asked_separately() -> None:
    solved, calls = SolvedClosures(), []

    def compute() -> Pylock:
        calls.append(1)
        return read_lock(EMPTY, source="t")

    solved.solve(("numpy",), compute)
    solved.solve(("numpy", "torch==2.0.1"), compute)
    assert len(calls) == 2


def test_a_failure_is_shared_too() -> None:
    solved, calls = SolvedClosures(), []

    def compute() -> Pylock:
        calls.append(1)
        raise ClosureError("uv could not resolve numpy")

    for _ in range(2):
        with pytest.raises(ClosureError, match="could not resolve numpy"):
            solved.solve(("numpy",), compute)
    assert len(calls) == 1
