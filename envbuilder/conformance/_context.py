"""What every check sees: the device, the run's size, and a per-process cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Context"]


@dataclass(frozen=True, kw_only=True)
class Context:
    device: str  # "cpu" or "cuda:N"
    quick: bool
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")
