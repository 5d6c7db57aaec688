"""``--driver``: NVIDIA's minor-version compatibility keeps a combination with a warning;
below it, or where PTX JIT is needed, the full-support driver is required."""

from __future__ import annotations

import pytest

from envbuilder.consumer.query import Query, answer
from envbuilder.lockfile.drivers import compatible_driver
from envbuilder.lockfile.model import CompatLock

#: every fixture lock is a CUDA 12.4 build (full support from 550.54.14)
CUDA = "py3.11-default-torch2.5.1-xformers0.0.28.post3"


@pytest.mark.parametrize(
    ("release", "floor"),
    [("11.8", "450.80.02"), ("12.1", "525.60.13"), ("12.9", "525.60.13"), ("13.0", "580.65.06")],
)
def test_the_minor_version_compatibility_floor(release: str, floor: str) -> None:
    assert compatible_driver(release) == floor


def test_an_older_driver_of_the_same_major_keeps_the_row_with_a_warning(
    compat: CompatLock,
) -> None:
    result = answer(compat, Query(gpu="H100", driver="535"))
    (match,) = [m for m in result.matches if m.entry.id == CUDA]
    assert match.warnings == (
        "driver 535 runs CUDA 12.x builds by NVIDIA's minor-version compatibility (from "
        "525.60.13) unless PTX JIT is needed; recommended for CUDA 12.4: 550.54.14 or newer",
    )
    assert CUDA not in {r.entry.id for r in result.rejected}


def test_the_full_support_driver_has_no_warning(compat: CompatLock) -> None:
    result = answer(compat, Query(gpu="H100", driver="550.54.15"))
    assert not any(m.warnings for m in result.matches)


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            Query(gpu="H100", driver="470"),
            "CUDA 12.4 needs driver >= 550.54.14, not 470 (not even minor-version "
            "compatibility's 525.60.13)",
        ),
        # xformers is built for "8.0 9.0+PTX": a B200 (sm_100) runs it only by PTX JIT
        (
            Query(gpu="B200", driver="535"),
            "CUDA 12.4 needs driver >= 550.54.14, not 535 (xformers reaches sm_100 only by "
            "PTX JIT, which minor-version compatibility does not cover)",
        ),
    ],
)
def test_below_the_floor_or_with_ptx_jit_the_row_is_rejected(
    compat: CompatLock, query: Query, reason: str
) -> None:
    rejected = {r.entry.id: r.reasons for r in answer(compat, query).rejected}
    assert reason in rejected[CUDA]
