"""A cold page cache for the benchmarks that time a first run (where the host allows it)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DROP_CACHES", "drop_caches"]

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches() -> bool:
    """Write dirty pages back and drop the page cache; False where that is not allowed
    (not root, a container without it), so the benchmark can say its runs were warm."""
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True
