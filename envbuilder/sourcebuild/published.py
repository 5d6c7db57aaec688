"""Release asset names of built wheels, and writing them.

A CUDA build of xformers is not byte-reproducible: a rebuild is another wheel, so
users install the very wheel that was built and measured. The GPU matrix workflow
builds it on the GPU runner (``envbuilder build-wheel ID --assets DIR``) and
publishes it with its build record as release assets beside ``compat.lock.json``,
under names unique within a release (`wheel_asset`, `record_asset`): two source
builds of one xformers release have the same wheel file name. ``install`` takes it
from there (`envbuilder.consumer.published_wheel`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from envbuilder.errors import InputError
from envbuilder.files import atomic_writer, sha256_file
from envbuilder.sourcebuild.cache import BuiltWheel, record_name

__all__ = ["record_asset", "wheel_asset", "write_assets"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def wheel_asset(combination: str, wheel_filename: str) -> str:
    """The built wheel's release asset name: ``<id>.<wheel file name>``, in the characters
    that release asset names keep (anything else becomes ``_``)."""
    return _UNSAFE.sub("_", f"{combination}.{wheel_filename}")


def record_asset(combination: str) -> str:
    """The build record's release asset name, as it is named in ``locks/``."""
    return _UNSAFE.sub("_", record_name(combination))


def write_assets(built: BuiltWheel, combination: str, directory: Path) -> tuple[Path, Path]:
    """*built*'s wheel and build record in *directory* under their release asset names
    (``build-wheel --assets DIR``: what the GPU matrix run publishes); their paths."""
    import shutil

    from envbuilder.files import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / wheel_asset(combination, built.path.name)
    with atomic_writer(wheel) as out, built.path.open("rb") as source:
        shutil.copyfileobj(source, out)
    if sha256_file(wheel) != built.sha256:
        wheel.unlink()
        raise InputError(f"{built.path} changed while it was copied to {directory}; run it again")
    record = directory / record_asset(combination)
    write_atomic(record, json.dumps(built.record, indent=2, sort_keys=True) + "\n")
    return wheel, record
