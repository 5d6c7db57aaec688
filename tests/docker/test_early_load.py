"""The layers below load while the ones above still install, against a real daemon: the
image comes out the same, the build's own load sends only what is above them, and no
early image stays behind, also where a killed build left one."""

from __future__ import annotations

import io
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import envbuilder.docker.early_load as early_load
from envbuilder.docker.containers import (
    OWNER_LABEL,
    ROLE_LABEL,
    _pid_namespace,
    owner_token,
    sweep_leftovers,
)
from envbuilder.docker.daemon import inspect_base, load_image
from envbuilder.docker.image_inputs import LAYERS
from envbuilder.docker.layers import archive_chunks, image_config
from envbuilder.reporter import Reporter
from tests.docker.conftest import Locked
from tests.docker.test_build import build, demo_tool, demo_tool_path, layer_ids
from tests.support.wheels import BuiltWheel, build_wheel

EARLY = re.compile(r"loaded ([a-z, -]+) \((\d+) new layer\(s\), \d+ MB\) while the rest installs")
FINAL = re.compile(r"docker load \S+ \((\d+) new layer\(s\)\)")


def early_images(client: Any) -> list[Any]:
    return list(client.images.list(filters={"label": f"{ROLE_LABEL}=early"}))


def big_cuda_lock(wheels: Path, seed: int) -> list[BuiltWheel]:
    """A lock whose ``cuda`` group is big (as a CUDA lock's toolkit libraries are) and whose
    torch takes a while to install above it."""
    return [
        build_wheel(wheels, "nvidia-fake-blas-cu12", "12.4.2", padding=96 * 2**20, seed=seed),
        build_wheel(wheels, "torch", "9.6.0", padding=64 * 2**20, seed=seed + 1),
        demo_tool(wheels),
    ]


def test_the_layers_below_load_while_torch_installs_and_the_image_is_the_same(
    docker_client: Any,
    base_image: str,
    wheel_cache: Any,
    synthetic_lock: Callable[[str, Sequence[BuiltWheel]], Locked],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wheels = tmp_path / "wheels"
    # the compiler layer is made once per base and process: made here first, then reused
    build(synthetic_lock("test-early-warm", [demo_tool(wheels)]), wheel_cache, base_image, tmp_path / "w")  # fmt: skip
    locked = synthetic_lock("test-early", big_cuda_lock(wheels, seed=90))
    out = io.StringIO()
    tag = build(locked, wheel_cache, base_image, tmp_path / "a", no_cache=True, reporter=Reporter(out))  # fmt: skip
    said = out.getvalue()
    prefixes = [m.group(1).split(", ") for m in EARLY.finditer(said)]
    assert prefixes, said
    for prefix in prefixes:
        assert prefix == list(LAYERS[: len(prefix)]) and prefix != list(LAYERS), said
    assert "cuda" in prefixes[0], said
    prefix = prefixes[-1]
    # the build's own load sent only the layers above the prefix (all new: a fresh lock)
    final = FINAL.search(said)
    assert final is not None, said
    assert int(final.group(1)) == len(LAYERS) - len(prefix), said
    assert early_images(docker_client) == []
    assert demo_tool_path(docker_client, tag) == "/opt/venv/bin/demo-tool"
    image = docker_client.images.get(tag)

    # The same lock without loading early (the layers gone from the daemon): the same image.
    docker_client.images.remove(image.id, force=True)
    monkeypatch.setattr(early_load, "EARLY_MIN_BYTES", 2**62)
    out = io.StringIO()
    again = build(locked, wheel_cache, base_image, tmp_path / "b", no_cache=True, reporter=Reporter(out))  # fmt: skip
    assert EARLY.search(out.getvalue()) is None
    assert again == tag
    assert docker_client.images.get(again).id == image.id
    assert layer_ids(docker_client, again) == image.attrs["RootFS"]["Layers"]


def dead_token() -> str:
    """An owner token of this host and namespace naming a process that is gone."""
    pid = next(p for p in range(4_000_000, 1, -1) if not Path(f"/proc/{p}").exists())
    return f"{socket.gethostname()}:{pid}:1:{_pid_namespace()}"


def test_an_early_image_a_killed_build_left_is_swept_and_a_running_build_s_stays(
    docker_client: Any, base_image: str, tmp_path: Path
) -> None:
    base = inspect_base(docker_client, base_image)
    tags = {"gone": dead_token(), "alive": owner_token()}
    for name, token in tags.items():
        config = image_config(
            base,
            [],
            env=[f"WHO={name}"],  # another config, another image
            labels={OWNER_LABEL: token, ROLE_LABEL: "early"},
            user="",
            workdir="",
            cmd=[],
        )
        load_image(docker_client, archive_chunks(config, tag=f"envbuilder-early/test-sweep:{name}"))  # fmt: skip
    try:
        out = io.StringIO()
        sweep_leftovers(docker_client, tmp_path, image=base.id, reporter=Reporter(out, verbose=1))
        left = {t for image in early_images(docker_client) for t in image.tags}
        assert "envbuilder-early/test-sweep:gone" not in left, out.getvalue()
        assert "envbuilder-early/test-sweep:alive" in left
        assert "removed the early-loaded image envbuilder-early/test-sweep:gone" in out.getvalue()
    finally:
        for image in early_images(docker_client):
            if any(t.startswith("envbuilder-early/test-sweep:") for t in image.tags):
                docker_client.images.remove(image.id, force=True)
