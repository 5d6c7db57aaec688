"""envbuilder: measured, published compatibility of Python, CUDA, PyTorch and xformers."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
