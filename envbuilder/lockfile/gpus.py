"""The GPU table's old home: its names live in `envbuilder.gpus` (kept for one release)."""

from __future__ import annotations

from envbuilder.gpus import (
    GPU_ARCH,
    GPU_COMPUTE_CAPABILITY,
    arch_covers,
    compute_capability,
    gpu_arch,
    gpu_model,
    same_model,
    sm,
)

__all__ = [
    "GPU_ARCH",
    "GPU_COMPUTE_CAPABILITY",
    "arch_covers",
    "compute_capability",
    "gpu_arch",
    "gpu_model",
    "same_model",
    "sm",
]
