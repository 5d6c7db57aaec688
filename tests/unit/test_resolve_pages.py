"""The pages a resolve's kept answers depend on: the deciding client's and those uv read
through the relay's process, which must hold too for a later run to keep the answers."""

from __future__ import annotations

from types import SimpleNamespace

from envbuilder.commands.resolve import _pages


def _client(pages: dict[str, float | None]) -> SimpleNamespace:
    return SimpleNamespace(pages_read=lambda: dict(pages))


def test_the_relay_s_pages_join_the_client_s_with_the_sooner_end() -> None:
    client = _client({"a": 100.0, "b": 100.0, "c": None, "d": 50.0})
    relay = SimpleNamespace(pages_read={"b": 70.0, "c": 90.0, "d": None, "e": 10.0})
    assert _pages(client, relay) == {"a": 100.0, "b": 70.0, "c": None, "d": None, "e": 10.0}


def test_a_relay_that_could_not_say_what_it_read_keeps_nothing() -> None:
    relay = SimpleNamespace(pages_read=None)
    assert _pages(_client({"a": 100.0}), relay) == {}
