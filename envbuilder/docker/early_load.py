"""Loading the layers below while the ones above still install.

The daemon applies a loaded image's layers one after the other, bottom first, after it
has read the whole archive. A build whose big layers sit low (a CUDA lock's ``cuda``
layer: the toolkit's libraries, gigabytes) would otherwise start that work only when
the last tree above them is final. `EarlyLoader` loads, as an image of their own, the
layers from the base up to the highest one whose tree is final, while the rest install;
the image's own load then finds them on the daemon and sends only what is above them.

That image is tagged ``envbuilder-early/<combination>:<token>`` (a prune does not take a
tagged image while the build runs) and labelled with the build's owner (`OWNER_LABEL`):
the build removes it once its own image holds the layers, and the next build's
`containers.sweep_leftovers` removes what a killed build left. Its layers are the build's
own: the same trees, hashed the same way, checked again while they are sent.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from envbuilder.docker.client import DockerClient
from envbuilder.docker.containers import (
    EARLY_ROLE,
    OWNER_LABEL,
    ROLE_LABEL,
    owner_token,
    remove_image_tag,
)
from envbuilder.docker.daemon import _daemon_chains, load_image
from envbuilder.docker.image_inputs import LAYERS, Inputs, LayerRecord, trees_to_send
from envbuilder.docker.layers import archive_chunks, image_config
from envbuilder.reporter import Reporter

__all__ = ["EARLY_MIN_BYTES", "EarlyLoader"]

#: A prefix is loaded early when the layers it would send (those the daemon lacks) hold
#: at least this many bytes: below that, a load of its own costs more than it saves.
EARLY_MIN_BYTES = 64 * 2**20
_REPOSITORY = "envbuilder-early"


class _Stopped(Exception):
    """The build went on without the early load (it failed, or was interrupted)."""


class EarlyLoader:
    """Loads the final prefix of an image's layers while the layers above it install.

    ``reused`` are the layers the build does not make (the daemon holds them, or this
    process keeps their trees); `layer_done` is told each layer the build makes, as soon
    as it is hashed. `finish` waits for the load under way; `abort` stops it; `remove`
    removes the images it loaded (their layers stay under the build's image)."""

    def __init__(
        self,
        client: DockerClient,
        inputs: Inputs,
        reused: Mapping[str, LayerRecord],
        *,
        reporter: Reporter,
        log: IO[str],
    ) -> None:
        self._client = client
        self._inputs = inputs
        self._records: dict[str, LayerRecord] = dict(reused)
        self._reporter = reporter
        self._log = log
        self._lock = threading.Lock()
        self._scheduled_upto = 0  # how many of LAYERS the last load scheduled found final
        self._tags: list[str] = []
        self._stop = threading.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envbuilder-early")
        self._token = uuid.uuid4().hex[:12]

    def layer_done(self, name: str, record: LayerRecord) -> None:
        """``name``'s tree is final and hashed: load the final prefix of the image's layers,
        unless it is the whole image (the build's own load sends that)."""
        with self._lock:
            self._records[name] = record
            top = self._final_top()
            if self._stop.is_set() or top == len(LAYERS) or top <= self._scheduled_upto:
                return
            self._scheduled_upto = top
            self._worker.submit(self._load_final_prefix)

    def _final_top(self) -> int:
        """How many of LAYERS, from the bottom, are final (made and hashed, or reused)."""
        top = 0
        while top < len(LAYERS) and LAYERS[top] in self._records:
            top += 1
        return top

    def finish(self) -> None:
        """Wait for the loads under way; one that failed leaves its layers to the build's
        own load (which says why, if it fails too)."""
        self._worker.shutdown(wait=True)

    def abort(self) -> None:
        """Stop the load under way (the daemon drops what it read) and every queued one."""
        with self._lock:  # no layer_done schedules a load after this
            self._stop.set()
        self._worker.shutdown(wait=True, cancel_futures=True)

    def remove(self) -> None:
        """Remove the images loaded early; the layers the build's image holds stay."""
        for tag in self._tags:
            if problem := remove_image_tag(self._client, tag):
                self._log.write(f"cannot remove the early-loaded image {tag}: {problem}\n")

    def _load_final_prefix(self) -> None:
        """Load the layers from the base up to the highest final one, when what the daemon
        lacks of them is worth a load of its own and more layers are still to come."""
        with self._lock:
            top = self._final_top()
            if self._stop.is_set() or top == len(LAYERS):
                return
            prefix = LAYERS[:top]
            records = {name: self._records[name] for name in prefix}
        try:
            self._load(prefix, records)
        except Exception as e:  # the build's own load sends these layers, and says why if it fails
            self._log.write(f"early load of {', '.join(prefix)} failed: {e}\n")

    def _load(self, prefix: Sequence[str], records: Mapping[str, LayerRecord]) -> None:
        started = time.monotonic()
        base = self._inputs.base
        diff_ids = [*base.diff_ids, *(records[name].layer.diff_id for name in prefix)]
        missing = trees_to_send(diff_ids, records.values(), _daemon_chains(self._client))
        size = sum(t.layer.size for t in missing.values())
        if size < EARLY_MIN_BYTES:
            return
        tag = f"{_REPOSITORY}/{self._inputs.resolved.id}:{self._token}-{len(prefix)}"
        config = image_config(
            base,
            [(f"envbuilder: {name} layer", records[name].layer) for name in prefix],
            env=base.config.get("Env") or [],
            labels={OWNER_LABEL: owner_token(), ROLE_LABEL: EARLY_ROLE},
            user="",
            workdir="",
            cmd=[],
        )
        try:
            load_image(self._client, self._until_stopped(archive_chunks(config, tag=tag, layer_trees=missing)))  # fmt: skip
        except _Stopped:
            return
        self._tags.append(tag)
        what = f"loaded {', '.join(prefix)} ({len(missing)} new layer(s), {size / 1e6:.0f} MB)"
        self._reporter.line(f"    {what} while the rest installs, in {time.monotonic() - started:.1f}s")  # fmt: skip
        self._log.write(f"{what} early\n")

    def _until_stopped(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if self._stop.is_set():
                raise _Stopped
            yield chunk
