"""Matrix cells for tests that need a `Combination` to answer, made from its id."""

from __future__ import annotations

from envbuilder.model import Combination
from envbuilder.target import parse_cuda_build

__all__ = ["cell"]


def cell(
    cid: str,
    *,
    python: str | None = None,
    cuda: str | None = None,
    torch: str | None = None,
    xformers: str | None = None,
    platform: str = "manylinux_2_28_x86_64",
) -> Combination:
    """The cell an id such as ``py3.11-cu121-torch2.4.1-xformers0.0.28.post1[-cudart]``
    names; each part can be given instead (ids of synthetic cells name none)."""
    parts = cid.split("-")
    python = python or parts[0].removeprefix("py")
    cuda = cuda or parts[1]
    torch = torch or next(p.removeprefix("torch") for p in parts if p.startswith("torch"))
    if xformers is None:
        xformers = next(
            (p.removeprefix("xformers") for p in parts if p.startswith("xformers")), None
        )
    build = parse_cuda_build(cuda)
    if build is None:
        raise ValueError(f"{cid!r}: no CUDA in {cuda!r}")
    return Combination(
        id=cid,
        python=python,
        cuda=build,
        torch=torch,
        xformers=xformers,
        platform=platform,
        add_cuda_runtime=cid.endswith("-cudart"),
    )
