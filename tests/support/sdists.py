"""Small sdists with a C extension, made by the tests, for the source builder (the benchmark's)."""

from __future__ import annotations

from envbuilder.bench.source_build import NETWORK_PROBE, c_extension_sdist, locked

__all__ = ["NETWORK_PROBE", "c_extension_sdist", "locked"]
