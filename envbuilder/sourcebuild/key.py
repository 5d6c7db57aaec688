"""The build key: what a built wheel is made from, as one sha256.

Two builds with the same key give the same wheel; a wheel in the cache under
a key is the build of exactly those inputs. Every input changes the key; the
order in which the architectures, flags or toolchain wheels are listed does
not. ``MAX_JOBS`` is no input: it changes how long a build takes, not what it makes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["KEY_FORMAT", "BuildKey"]

KEY_FORMAT = 2
"""Changes whenever the same inputs would build another wheel (the recipe changed).

2: shared libraries normalised (nvcc's temporary names, the build id) and an
in-place build's path written as ``/build``."""


@dataclass(frozen=True, kw_only=True)
class BuildKey:
    """The inputs of one source build.

    ``torch`` is the torch wheel's sha256, ``host:<identity>`` for the host's
    torch (``--in-place``), or ``none`` for an sdist that builds without it.
    ``toolchain`` holds the build group's wheels (``name==version sha256=…``) and,
    with the host's compiler, its identity (``host-nvcc:<sha256 of nvcc --version>``).
    ``builder`` is the builder image's digest, or the host's interpreter and C++
    compiler for ``--in-place``.
    """

    sdist_sha256: str
    torch: str
    toolchain: frozenset[str]
    arch_list: frozenset[str]
    flags: frozenset[str]
    builder: str
    recipe: str  # sha256 of the in-builder script and the wheel normaliser

    @classmethod
    def of(
        cls,
        *,
        sdist_sha256: str,
        torch: str,
        toolchain: Iterable[str],
        arch_list: Iterable[str],
        flags: Iterable[str],
        builder: str,
        recipe: str,
    ) -> BuildKey:
        return cls(
            sdist_sha256=sdist_sha256,
            torch=torch,
            toolchain=frozenset(toolchain),
            arch_list=frozenset(arch_list),
            flags=frozenset(flags),
            builder=builder,
            recipe=recipe,
        )

    def inputs(self) -> dict[str, Any]:
        """The inputs as JSON, lists sorted: what the build record shows."""
        return {
            "format": KEY_FORMAT,
            "sdist_sha256": self.sdist_sha256,
            "torch": self.torch,
            "toolchain": sorted(self.toolchain),
            "arch_list": sorted(self.arch_list),
            "flags": sorted(self.flags),
            "builder": self.builder,
            "recipe": self.recipe,
        }

    @property
    def digest(self) -> str:
        text = json.dumps(self.inputs(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
