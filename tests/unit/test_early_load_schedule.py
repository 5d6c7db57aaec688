"""Which layers a build loads early, and that a stopped build's early load stops (a fake
daemon: what it holds, and what each load sends)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import envbuilder.docker.early_load as early_load
from envbuilder.docker.early_load import EarlyLoader
from envbuilder.docker.image_inputs import LAYERS, LayerRecord
from envbuilder.docker.layers import Layer, chain_ids
from envbuilder.reporter import Reporter

MB = 2**20
INPUTS = SimpleNamespace(
    base=SimpleNamespace(config={}, diff_ids=()),
    resolved=SimpleNamespace(id="py3.11-cpu-torch9.0.0"),
)


def record(name: str, size: int, *, tree: bool = True) -> LayerRecord:
    return LayerRecord(
        layer=Layer(diff_id=f"sha256:{name:0>64}", size=size),
        entries=(),
        tree=Path(f"/nonexistent/{name}") if tree else None,
    )


class Daemon:
    """What the fake daemon holds (chain ids) and each early load: the layers it named and
    those it sent."""

    def __init__(self, records: Mapping[str, LayerRecord], holds: Sequence[str] = ()) -> None:
        self.records = records
        self.chains = set(self._chains(holds))
        self.loads: list[tuple[tuple[str, ...], list[str]]] = []

    def _chains(self, names: Sequence[str]) -> tuple[str, ...]:
        return chain_ids([self.records[n].layer.diff_id for n in names])

    def archive(self, config: bytes, *, tag: str, layer_trees: Mapping[str, Any]) -> Iterator[bytes]:  # fmt: skip
        names = LAYERS[: int(tag.rsplit("-", 1)[1])]
        sent = [n for n in names if self.records[n].layer.diff_id in layer_trees]
        self.loads.append((names, sent))
        self.chains.update(self._chains(names))
        yield b""


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Daemon]]:
    def make(records: Mapping[str, LayerRecord], holds: Sequence[str] = ()) -> Daemon:
        fake = Daemon(records, holds)
        monkeypatch.setattr(early_load, "_daemon_chains", lambda client: set(fake.chains))
        monkeypatch.setattr(early_load, "archive_chunks", fake.archive)
        monkeypatch.setattr(early_load, "load_image", lambda client, chunks: list(chunks))
        monkeypatch.setattr(early_load, "image_config", lambda *a, **kw: b"{}")
        return fake

    yield make


def loader(reused: Mapping[str, LayerRecord]) -> EarlyLoader:
    return EarlyLoader(
        None,  # type: ignore[arg-type]
        INPUTS,  # type: ignore[arg-type]
        reused,
        reporter=Reporter(io.StringIO()),
        log=io.StringIO(),
    )


def done(early: EarlyLoader, name: str, records: Mapping[str, LayerRecord]) -> None:
    """Tell ``early`` that ``name`` is final, and wait for what that starts."""
    early.layer_done(name, records[name])
    early._worker.submit(lambda: None).result()


SIZES = {
    "compiler": 260, "venv": 1, "cuda": 2000, "cuda-bytecode": 1, "runtime": 10,
    "runtime-bytecode": 1, "torch": 700, "torch-bytecode": 60, "libs": 80, "libs-bytecode": 20,
    "rest": 5, "rest-bytecode": 1, "suite": 90, "suite-bytecode": 30,
}  # fmt: skip


def upto(name: str) -> tuple[str, ...]:
    return LAYERS[: LAYERS.index(name) + 1]


def test_a_big_low_layer_loads_with_the_final_layers_below_it(daemon: Any) -> None:
    assert set(SIZES) == set(LAYERS)
    records = {n: record(n, mb * MB) for n, mb in SIZES.items()}
    fake = daemon(records, holds=["compiler"])
    early = loader({"compiler": replace(records["compiler"], tree=None)})
    done(early, "cuda", records)  # venv, below it, is not final yet
    done(early, "venv", records)
    for name in ("cuda-bytecode", "runtime", "runtime-bytecode"):
        done(early, name, records)  # 12 MB more than the daemon holds: not worth a load
    done(early, "torch", records)  # its bytecode is still compiled
    done(early, "libs", records)  # torch's bytecode, below it, is not final yet
    done(early, "torch-bytecode", records)
    for name in ("libs-bytecode", "rest", "rest-bytecode", "suite"):
        done(early, name, records)
    done(early, "suite-bytecode", records)  # the whole image: the build's own load
    early.finish()
    assert fake.loads == [
        (upto("cuda"), ["venv", "cuda"]),
        (upto("torch"), ["cuda-bytecode", "runtime", "runtime-bytecode", "torch"]),
        (upto("libs"), ["torch-bytecode", "libs"]),
        (upto("suite"), ["libs-bytecode", "rest", "rest-bytecode", "suite"]),
    ]


def test_a_reused_layer_the_daemon_lacks_counts_as_sent(daemon: Any) -> None:
    """This process keeps the compiler's tree, but the image that held it was removed: the
    early load sends it while torch installs."""
    records = {n: record(n, mb * MB) for n, mb in SIZES.items()}
    fake = daemon(records)
    early = loader({"compiler": records["compiler"]})
    done(early, "venv", records)
    early.finish()
    assert fake.loads == [(("compiler", "venv"), ["compiler", "venv"])]


def test_small_layers_are_left_to_the_build_s_own_load(daemon: Any) -> None:
    records = {n: record(n, MB) for n in LAYERS}
    fake = daemon(records, holds=["compiler"])
    early = loader({"compiler": records["compiler"]})
    for name in LAYERS[1:-1]:
        done(early, name, records)
    early.finish()
    assert fake.loads == []


def test_nothing_loads_after_the_build_stopped(daemon: Any) -> None:
    records = {n: record(n, mb * MB) for n, mb in SIZES.items()}
    fake = daemon(records)
    early = loader({"compiler": records["compiler"]})
    early.abort()
    early.layer_done("venv", records["venv"])
    early.layer_done("cuda", records["cuda"])
    assert fake.loads == []


def test_an_early_load_under_way_stops_when_the_build_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive stops mid-way (the daemon drops what it read): nothing is tagged, and the
    build does not wait for the rest of a multi-gigabyte layer to be sent."""
    reading = threading.Event()
    sent: list[int] = []

    def endless(config: bytes, **kw: Any) -> Iterator[bytes]:
        deadline = time.monotonic() + 30  # a layer of gigabytes, as far as the test goes
        while time.monotonic() < deadline:
            yield b"\0" * 512

    def load_image(client: Any, chunks: Iterator[bytes]) -> None:
        for chunk in chunks:
            sent.append(len(chunk))
            reading.set()

    monkeypatch.setattr(early_load, "archive_chunks", endless)
    monkeypatch.setattr(early_load, "load_image", load_image)
    monkeypatch.setattr(early_load, "_daemon_chains", lambda client: set())
    monkeypatch.setattr(early_load, "image_config", lambda *a, **kw: b"{}")
    early = loader({"compiler": record("compiler", MB)})
    early.layer_done("venv", record("venv", MB))
    early.layer_done("cuda", record("cuda", 2000 * MB))
    assert reading.wait(10)
    stopping = threading.Thread(target=early.abort)  # returns once the load has stopped
    stopping.start()
    stopping.join(10)
    assert not stopping.is_alive(), "the early load went on after the build stopped"
    count = len(sent)
    assert early._tags == []
    assert len(sent) == count
