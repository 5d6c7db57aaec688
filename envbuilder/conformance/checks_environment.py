from __future__ import annotations

from envbuilder.conformance._context import Context
from envbuilder.conformance._record import CheckSpec


def specs(ctx: Context) -> list[CheckSpec]:
    return []
