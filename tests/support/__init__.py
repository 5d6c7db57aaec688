"""Reusable test helpers: real wheels (`tests.support.wheels`), a loopback
Simple API index server (`tests.support.index_server`) and a fake evidence
source for the resolver (`tests.support.evidence`). Fixtures wrapping them
live in ``tests/integration/conftest.py``."""
