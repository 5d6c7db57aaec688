"""Reusable test helpers: real wheels (`tests.support.wheels`) and a loopback
Simple API index server (`tests.support.index_server`). Fixtures wrapping them
live in ``tests/integration/conftest.py``."""
