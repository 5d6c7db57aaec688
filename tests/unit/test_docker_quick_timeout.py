"""The short timeout of the calls that answer at once, on the one client a build's threads
share: blocks that overlap put the client's own timeout back when the last one closes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from envbuilder.docker.daemon import _QUICK_TIMEOUT_S, _quick

LONG = 4 * 3600


def test_overlapping_blocks_of_two_threads_leave_the_long_timeout() -> None:
    """The main thread opens a block, the compiler's thread opens one, the main thread's
    closes first: the client must not keep the short timeout for the rest of the build."""
    client = SimpleNamespace(api=SimpleNamespace(timeout=LONG))
    main_open, other_open, main_closed = threading.Event(), threading.Event(), threading.Event()
    seen: list[float] = []

    def other() -> None:
        main_open.wait(5)
        with _quick(client):
            other_open.set()
            main_closed.wait(5)
            seen.append(client.api.timeout)

    thread = threading.Thread(target=other)
    thread.start()
    with _quick(client):
        main_open.set()
        other_open.wait(5)
        seen.append(client.api.timeout)
    main_closed.set()
    thread.join(5)
    assert seen == [_QUICK_TIMEOUT_S, _QUICK_TIMEOUT_S]  # short inside either block
    assert client.api.timeout == LONG


def test_a_nested_block_keeps_the_short_timeout_until_the_outer_one_closes() -> None:
    client = SimpleNamespace(api=SimpleNamespace(timeout=LONG))
    with _quick(client):
        with _quick(client):
            assert client.api.timeout == _QUICK_TIMEOUT_S
        assert client.api.timeout == _QUICK_TIMEOUT_S
    assert client.api.timeout == LONG


def test_a_client_already_quicker_is_left_alone() -> None:
    client = SimpleNamespace(api=SimpleNamespace(timeout=5))
    with _quick(client):
        assert client.api.timeout == 5
    assert client.api.timeout == 5
