"""The relay for uv (`IndexRelay`) in a process of its own.

A cold resolve is bound by envbuilder's own interpreter: its deciding threads, the
threads writing locks and the relay's threads (serving uv's requests, parsing and
rewriting pages, fetching ahead) all wait for one interpreter lock, while the
machine's other cores sit mostly idle (uv's processes need little CPU). Run in a
process of its own, the relay serves uv from another core.

The process has its own `HttpClient`, made with the same options, so it shares the
run's on-disk caches (HTTP and blobs) but not the parent's memory: a page both read
at once may be fetched twice. When it stops, its requests and bytes are added to the
run's counts, and the pages it read to those the run's kept answers depend on
(`envbuilder.resolve.memo`): what uv was told must hold too for a later run to keep them.

The parent starts it as ``python -c`` with its own ``sys.path`` (whatever made
envbuilder importable here makes it importable there) and talks to it in JSON
lines over the child's stdin and stdout: the options first, then each index's relay
URL, uv's answers to restore, and the stop. The child's stdout is kept for that
alone (anything printed goes to stderr, which is the parent's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

from envbuilder.credentials import Credentials
from envbuilder.errors import EnvbuilderError

__all__ = ["RelayProcess"]

logger = logging.getLogger(__name__)

#: seconds the parent waits for the relay's process to start (a new interpreter importing
#: the client: 0.3 s here) and to answer each question
ANSWER_TIMEOUT_S = 60.0
#: seconds it waits for the process to stop before killing it
STOP_TIMEOUT_S = 10.0
#: the `HttpClient` options the process is made with (all that `resolve` passes)
CLIENT_OPTIONS = frozenset({"cache_dir", "offline", "max_workers", "ca_bundle", "credentials"})

_BOOT = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); import {0}; {0}.main()"


def _encoded(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(options) - CLIENT_OPTIONS
    if unknown:
        raise ValueError(f"the relay's process takes no client option {sorted(unknown)}")
    encoded = dict(options)
    if encoded.get("cache_dir") is not None:
        encoded["cache_dir"] = str(encoded["cache_dir"])
    if encoded.get("credentials") is not None:
        encoded["credentials"] = {h: list(up) for h, up in encoded["credentials"]}
    return encoded


def _decoded(encoded: Mapping[str, Any]) -> dict[str, Any]:
    options = dict(encoded)
    if options.get("cache_dir") is not None:
        options["cache_dir"] = Path(options["cache_dir"])
    if options.get("credentials") is not None:
        options["credentials"] = Credentials(
            {host: (user, password) for host, (user, password) in options["credentials"].items()}
        )
    return options


def main() -> None:
    """The relay's process: serve until the parent says stop or closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the pipe, kept for answers
    os.dup2(2, 1)  # and whatever prints goes to stderr
    start = json.loads(sys.stdin.readline() or "null")
    if not isinstance(start, dict):
        return
    if start["log_level"] <= logging.DEBUG:
        logging.basicConfig(stream=sys.stderr, level=start["log_level"])

    def answer(value: object) -> bool:
        try:
            answers.write(json.dumps(value) + "\n")
            answers.flush()
        except OSError:  # a broken pipe: the parent is gone (interrupted); leave quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())
            return False
        return True

    from envbuilder.index.http import HttpClient
    from envbuilder.index.relay import IndexRelay

    try:
        client = HttpClient(**_decoded(start["client"]))
        relay = IndexRelay(client, platforms=start["platforms"], pythons=start["pythons"])
    except Exception as e:  # the parent reports it
        answer({"failed": f"{type(e).__name__}: {e}"})
        return
    with client, relay:
        answered = answer({"ready": True})
        for line in sys.stdin if answered else ():
            op, arg = json.loads(line)
            if op == "index":
                answered = answer(relay.index_url(arg))
            elif op == "restore":
                answered = answer(relay.restore(arg))
            else:  # "stop": what the run's summary and its kept answers need
                answer([client.requests_made, client.bytes_downloaded, client.pages_read()])
                break
            if not answered:
                break
        client.cancel()  # guesses still in flight end at their next step, not at their timeout


class RelayProcess:
    """``with RelayProcess(options, ...) as relay:`` what `IndexRelay` offers uv
    (`index_url`, `restore`), served from a process of its own whose `HttpClient` is
    made with ``options`` (`CLIENT_OPTIONS`); after the block, its `requests_made`,
    `bytes_downloaded` and `pages_read`."""

    def __init__(
        self,
        client_options: Mapping[str, Any],
        *,
        platforms: Collection[str] | None = None,
        pythons: Collection[str] = (),
    ) -> None:
        self._start = {
            "client": _encoded(client_options),
            "platforms": None if platforms is None else sorted(platforms),
            "pythons": sorted(pythons),
            "log_level": logging.getLogger("envbuilder").getEffectiveLevel(),
        }
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._ready = False
        self._answers: queue.Queue[str] = queue.Queue()  # its lines; "" once it has ended
        self._urls: dict[str, str] = {}
        self.requests_made = 0
        self.bytes_downloaded = 0
        #: the URLs its client read (`HttpClient.pages_read`), once it stopped as asked;
        #: None before, or when it did not (then nothing vouches for what uv was told)
        self.pages_read: dict[str, float | None] | None = None

    def __enter__(self) -> RelayProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(__name__), json.dumps(sys.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        assert self._process.stdout is not None
        threading.Thread(
            target=_read_lines,
            args=(self._process.stdout, self._answers),
            name="relay-answers",
            daemon=True,
        ).start()
        self._send(self._start)  # it starts while the parent decides
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        process = self._process
        if process is None:
            return
        stop = exc_type is None and self._ready  # else: no need of its counts, or none made
        if not stop:
            if exc_type is None:  # never asked for an index: no uv process could reach it
                self.pages_read = {}
            process.terminate()
        with self._lock:
            try:
                if stop:
                    self._send(["stop", None])
                    self.requests_made, self.bytes_downloaded, self.pages_read = self._receive()
            except EnvbuilderError as e:
                logger.debug("relay process: %s", e)
            finally:
                if process.stdin is not None:
                    process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:  # after the process: its reader has met the end
            process.stdout.close()

    def _send(self, message: object) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except OSError as e:  # a broken pipe: the process is gone
            raise self._stopped(str(e)) from e

    def _receive(self) -> Any:
        try:
            line = self._answers.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            raise self._stopped(f"no answer in {ANSWER_TIMEOUT_S:.0f} s") from None
        if not line:
            self._answers.put(line)  # the end stays the end for whoever asks next
            raise self._stopped("no answer")
        return json.loads(line)

    def _stopped(self, why: str) -> EnvbuilderError:
        code = None
        if self._process is not None:
            # a pipe that broke or ended: the process is exiting, if not gone
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._process.wait(timeout=1.0)
        state = "is not answering" if code is None else f"stopped (exit code {code})"
        return EnvbuilderError(f"the index relay's process {state}: {why}")

    def _ask(self, op: str, arg: str) -> Any:
        with self._lock:
            if self._process is None or self._process.stdin is None:
                raise EnvbuilderError("the index relay is not running")
            if self._process.stdin.closed:
                raise EnvbuilderError("the index relay has stopped")
            if not self._ready:  # the first question waits for the process to start
                started = self._receive()
                if "failed" in started:
                    raise EnvbuilderError(f"the index relay's process failed: {started['failed']}")
                self._ready = True
            self._send([op, arg])
            return self._receive()

    def index_url(self, upstream: str) -> str:
        """The relay's address for the Simple API index at ``upstream``."""
        url = self._urls.get(upstream)
        if url is None:
            url = self._urls[upstream] = str(self._ask("index", upstream))
        return url

    def restore(self, text: str) -> str:
        """``text`` with every relay URL turned back into the index's own."""
        return str(self._ask("restore", text)) if text else text


def _read_lines(stream: IO[str], into: queue.Queue[str]) -> None:
    """Each line of ``stream`` into ``into``, then "" at its end: one reader for the
    process's life, so that a late answer is never taken by the wrong question."""
    with contextlib.suppress(OSError, ValueError):  # the pipe closed under it
        for line in stream:
            into.put(line)
    into.put("")
