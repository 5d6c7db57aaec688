"""Running the conformance suite in a container of a combination's image.

The suite's source is mounted read-only (it imports only the standard
library, torch, xformers and diffusers, which the image has); the host's
GPUs are passed through Docker device requests; results come back through
a scratch volume and are copied atomically.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envbuilder.errors import MissingToolError
from envbuilder.files import write_atomic

__all__ = ["SUITE_MOUNT", "gpu_request", "run_suite_container"]

#: where the suite's source is mounted inside a container (a path in the container only)
SUITE_MOUNT = "/envbuilder-suite"


def gpu_request(client: Any, allow_cpu: bool) -> list[Any]:
    """Docker device requests for every GPU of the host, or none with ``allow_cpu``."""
    from docker.types import DeviceRequest

    runtimes = client.info().get("Runtimes", {}) or {}
    has_gpu = "nvidia" in runtimes or shutil.which("nvidia-smi") is not None
    if has_gpu:
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if allow_cpu:
        return []
    raise MissingToolError(
        "no GPU for containers: the Docker daemon has no 'nvidia' runtime and nvidia-smi is not"
        " on PATH; install the NVIDIA driver and NVIDIA Container Toolkit, run on a GPU runner,"
        " or pass --allow-cpu to run only the CPU checks"
    )


def run_suite_container(
    client: Any,
    tag: str,
    command: Sequence[str],
    *,
    devices: Sequence[Any],
    suite_dir: Path,
    out_dir: Path,
    results: str,
) -> tuple[int, str | None]:
    """Run the suite in a container of *tag*, writing ``/results/<results>``.

    The image runs as its own unprivileged user, whose uid owns nothing on
    this host, so the container writes into a scratch directory anyone may
    write to. When the results file was written, it and its JSONL stream are
    copied, atomically, into *out_dir*; when not, earlier results there are
    left alone and a non-empty stream (the checks that finished before the
    suite died) is kept as ``<id>.failed.jsonl``. The container has no
    network: the suite needs none.

    Returns the container's exit status and what was copied: *results*, the
    kept stream's name, or None.
    """
    stream = f"{results}.jsonl"
    with tempfile.TemporaryDirectory(prefix="envbuilder-results-") as scratch:
        Path(scratch).chmod(0o777)
        container = client.containers.run(
            tag,
            command=list(command),
            detach=True,
            environment={
                "PYTHONPATH": SUITE_MOUNT,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
            volumes={
                str(suite_dir): {"bind": f"{SUITE_MOUNT}/envbuilder", "mode": "ro"},
                scratch: {"bind": "/results", "mode": "rw"},
            },
            device_requests=list(devices),
            network_mode="none",
            shm_size="8g",
        )
        try:
            for chunk in container.logs(stream=True, follow=True):
                sys.stderr.write(chunk.decode("utf-8", errors="replace"))
            status = int(container.wait().get("StatusCode", 1))
        finally:
            container.remove(force=True)
            made, partial = Path(scratch) / results, Path(scratch) / stream
            copied: str | None = None
            if made.is_file():
                if partial.is_file():
                    write_atomic(out_dir / stream, partial.read_bytes())
                write_atomic(out_dir / results, made.read_bytes())
                copied = results
            elif partial.is_file() and partial.stat().st_size:
                copied = results.removesuffix(".json") + ".failed.jsonl"
                write_atomic(out_dir / copied, partial.read_bytes())
    return status, copied
