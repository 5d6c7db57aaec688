"""Running the conformance suite in a container of a combination's image.

The suite's source is mounted read-only (it imports only the standard
library, torch, xformers and diffusers, which the image has); the GPUs
this run was assigned are passed through Docker device requests, by id and
never "all": several runners on one multi-GPU host each own their GPUs
(``assigned_gpus``: from the environment, else from a ``gpu-index-<N>`` label
among the runner's labels); results come back through a scratch volume and are
copied atomically.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuilder.docker.containers import remove_container
from envbuilder.errors import InputError, MissingToolError
from envbuilder.files import write_atomic

__all__ = [
    "GPU_LABEL_PREFIX",
    "GPU_VARIABLES",
    "RUNNER_LABELS",
    "SUITE_MOUNT",
    "assigned_gpus",
    "gpu_request",
    "label_gpus",
    "run_suite_container",
]

#: where the suite's source is mounted inside a container (a path in the container only)
SUITE_MOUNT = "/envbuilder-suite"

#: Where a run learns its GPUs, first found wins: envbuilder's own setting, then what CUDA
#: and the NVIDIA Container Toolkit read. A runner sets one in its ``.env`` (docs/docker.md).
GPU_VARIABLES = ("ENVBUILDER_GPUS", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
#: A GPU as CUDA_VISIBLE_DEVICES and Docker's device requests name it: an index, a GPU UUID
#: or a MIG instance.
_GPU_ID = re.compile(r"\d{1,3}|GPU-[0-9A-Fa-f-]{8,64}|MIG-[0-9A-Za-z/-]{8,80}")
#: Values that name no device: CUDA_VISIBLE_DEVICES="" hides every GPU, and the toolkit's
#: ``none``/``void``.
_NO_GPU = frozenset({"", "none", "void", "-1"})
#: The runner's labels, comma-separated as ``config.sh --labels`` takes them; the GPU
#: matrix workflow sets it to its job's ``runs-on`` labels (every one a label of the runner
#: GitHub gave the job).
RUNNER_LABELS = "ENVBUILDER_RUNNER_LABELS"
#: A runner label naming the GPU index the runner owns on its host: ``gpu-index-1``.
GPU_LABEL_PREFIX = "gpu-index-"


def label_gpus(labels: str) -> tuple[str, ...] | None:
    """The GPU a runner's labels name (``gpu-index-<N>``), None when none names one.
    Labels that name two indexes conflict: refused, as is a label whose index is no
    number."""
    indexes: dict[str, str] = {}
    for label in (part.strip() for part in labels.split(",")):
        if not label.lower().startswith(GPU_LABEL_PREFIX):
            continue
        index = label[len(GPU_LABEL_PREFIX) :]
        if not re.fullmatch(r"\d{1,3}", index):
            raise InputError(
                f"runner label {label!r}: {index!r} is not a GPU index;"
                f" name the runner's GPU as {GPU_LABEL_PREFIX}<N>, e.g. {GPU_LABEL_PREFIX}1"
            )
        indexes.setdefault(str(int(index)), label)
    if len(indexes) > 1:
        raise InputError(
            f"the runner's labels name {len(indexes)} GPUs ({', '.join(indexes.values())}):"
            f" give a runner one {GPU_LABEL_PREFIX}<N> label, or name its GPUs in"
            " CUDA_VISIBLE_DEVICES in its .env file"
        )
    return tuple(indexes) or None


def assigned_gpus(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs this run may use, from the first of ``GPU_VARIABLES`` that is set: ids in
    its order, ``()`` for none; when no variable names any (``all`` names no particular
    GPU, so the next variable is read), the GPU a ``gpu-index-<N>`` label among
    ``RUNNER_LABELS`` names; else None. The environment wins over the labels."""
    for name in GPU_VARIABLES:
        value = environ.get(name)
        if value is None or value.strip().lower() == "all":
            continue
        if value.strip().lower() in _NO_GPU:
            return ()
        ids = tuple(part.strip() for part in value.split(","))
        bad = [i for i in ids if not _GPU_ID.fullmatch(i)]
        if bad:
            raise InputError(
                f"{name}={value!r}: {bad[0]!r} is not a GPU index, GPU-<uuid> or MIG-<id>;"
                " give the runner's GPUs as a comma-separated list, e.g. 0 or 0,1"
            )
        if len(set(ids)) != len(ids):
            raise InputError(f"{name}={value!r} names a GPU twice")
        return ids
    return label_gpus(environ.get(RUNNER_LABELS, ""))


def gpu_request(
    client: Any, allow_cpu: bool, environ: Mapping[str, str] | None = None
) -> list[Any]:
    """Docker device requests for the GPUs this run was assigned (``assigned_gpus`` of
    ``environ``, default the process's), or none with ``allow_cpu`` on a host without
    GPUs. Never every GPU of the host: a GPU host whose run names none is an error."""
    from docker.types import DeviceRequest

    environ = os.environ if environ is None else environ
    runtimes = client.info().get("Runtimes", {}) or {}
    has_gpu = "nvidia" in runtimes or shutil.which("nvidia-smi") is not None
    assigned = assigned_gpus(environ) if has_gpu else None
    if has_gpu and assigned:
        return [DeviceRequest(device_ids=list(assigned), capabilities=[["gpu"]])]
    if allow_cpu:
        return []
    if has_gpu:
        told = "assigns no GPU" if assigned == () else "names none"
        raise InputError(
            f"this host has GPUs, and this run {told} ({', '.join(GPU_VARIABLES)}, or a"
            f" {GPU_LABEL_PREFIX}<N> runner label); a"
            " container never gets every GPU, since several runners may share the host:"
            " set CUDA_VISIBLE_DEVICES to this run's GPUs (e.g. 0, or 0,1), in a self-hosted"
            " runner's .env file, or pass --allow-cpu to run only the CPU checks"
        )
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
            # a removal the daemon refuses must not cost the results: they are copied anyway
            if problem := remove_container(container):
                print(
                    f"warning: {problem}; remove it with `docker rm -f {container.short_id}`",
                    file=sys.stderr,
                )
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
