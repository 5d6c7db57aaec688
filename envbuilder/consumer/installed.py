"""What this environment has installed, read without importing it, and how that differs
from a combination (``envbuilder conformance --in-place`` runs only in the environment
the combination describes).

torch's version and CUDA come from ``torch/version.py``: the suite's processes import
torch, and an import here would be one more on the way to the first check (seconds on
a cold disk).
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

from envbuilder.errors import MissingToolError
from envbuilder.model import Combination
from envbuilder.target import cuda_tag_of

__all__ = ["environment_mismatches", "installed_version", "torch_here"]


def environment_mismatches(
    combination: Combination,
    *,
    torch_version: str | None,
    torch_cuda: str | None,
    xformers_version: str | None,
) -> list[str]:
    """How this environment differs from ``combination``; empty when it is that combination.

    Public versions are compared (``2.11.0+cu130`` is ``2.11.0``), and the
    CUDA of the running torch must agree with the combination's unless the
    combination takes whatever build the index has (``default``).
    """
    from packaging.version import InvalidVersion, Version

    def public(v: str) -> Version | None:
        try:
            return Version(Version(v).public)
        except InvalidVersion:
            return None

    problems: list[str] = []
    if torch_version is None:
        problems.append("torch is not installed here")
    elif public(torch_version) != public(combination.torch):
        problems.append(
            f"torch is {torch_version!r} here, {combination.torch!r} in {combination.id}"
        )
    elif combination.cuda != "default" and cuda_tag_of(torch_cuda) != str(combination.cuda):
        problems.append(
            f"torch here is built for {cuda_tag_of(torch_cuda)!r} (torch {torch_version!r}),"
            f" {combination.id} needs {str(combination.cuda)!r}"
        )
    if combination.xformers is None:
        if xformers_version is not None:
            problems.append(
                f"xformers {xformers_version!r} is installed, {combination.id} has none"
            )
    elif xformers_version is None:
        problems.append(
            f"xformers is not installed, {combination.id} needs {combination.xformers!r}"
        )
    elif public(xformers_version) != public(combination.xformers):
        problems.append(
            f"xformers is {xformers_version!r} here, {combination.xformers!r} in {combination.id}"
        )
    return problems


_TORCH_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(None|['\"]([^'\"]*)['\"])", re.M)


def torch_here() -> tuple[str, str | None]:
    """torch's version and the CUDA it was built with, read from ``torch/version.py``
    without importing torch: the suite's processes import it, and an import here would
    be one more on the way to the first check (seconds on a cold disk). Imports torch
    only when that file does not say."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingToolError(f"torch is not importable in this environment ({sys.executable})")
    text = ""
    for folder in spec.submodule_search_locations:
        with contextlib.suppress(OSError):
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
            break
    version, cuda = _TORCH_VERSION.search(text), _TORCH_CUDA.search(text)
    if version is not None and cuda is not None:
        return version.group(1), cuda.group(2)
    try:
        import torch
    except ImportError as e:
        raise MissingToolError(
            f"torch is not importable in this environment ({sys.executable}): {e}"
        ) from e
    return str(torch.__version__), torch.version.cuda


def installed_version(dist: str) -> str | None:
    """The version of an installed distribution here, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
