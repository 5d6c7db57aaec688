"""``envbuilder build`` end to end: selection, skipping with reasons, logs, errors, ``--push``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import image_tag, lock_digest
from envbuilder.model import lock_filename
from tests.docker.conftest import TORCH_ID


def envbuilder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=1800,
    )


def torch_tag(locks: Path) -> str:
    return image_tag(TORCH_ID, lock_digest((locks / lock_filename(TORCH_ID)).read_bytes()))


def test_build_makes_the_resolved_and_skips_the_unsatisfiable(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    done = envbuilder(
        "build", "py3.11", "--locks", str(torch_locks), "--log-dir", str(tmp_path / "logs"),
        "--wheel-cache", str(wheel_cache.root),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [torch_tag(torch_locks)]
    assert (
        "py3.11-cpu-torch2.12.0: skipped, unsatisfiable: no torch 2.12.0 wheel for cp311 on any index"
        in done.stderr
    )
    assert "1 image(s) ready, 1 combination(s) skipped" in done.stderr


def test_forced_build_writes_one_log_per_combination(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    done = envbuilder(
        "build", TORCH_ID, "--force", "--locks", str(torch_locks), "--log-dir", str(tmp_path / "logs"),
        "--wheel-cache", str(wheel_cache.root),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"{TORCH_ID}.log"]
    log = (tmp_path / "logs" / f"{TORCH_ID}.log").read_text(encoding="utf-8")
    assert f"tagged {torch_tag(torch_locks)}" in log


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["torch9"], 2, "selector 'torch9' matches no combination"),
        (
            ["--all", "--locks", "/nonexistent-locks"],
            2,
            "resolution.json: not found; run `nox -s resolve` first",
        ),
        ([], 2, "or --all"),
        (["py3.11", "--all"], 2, "give SELECTORs or --all, not both"),
    ],
)
def test_bad_input_exits_2_with_the_problem(
    torch_locks: Path, args: list[str], status: int, message: str
) -> None:
    done = envbuilder("build", "--locks", str(torch_locks), *args)
    assert done.returncode == status
    assert message in done.stderr


def test_without_a_daemon_the_error_says_how_to_start_one(
    torch_locks: Path, tmp_path: Path
) -> None:
    done = envbuilder(
        "build",
        "--all",
        "--locks",
        str(torch_locks),
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"},
    )
    assert done.returncode == 3
    assert "no Docker daemon answered" in done.stderr
    assert "sudo bash .ci/setup" in done.stderr


def test_a_selection_that_builds_nothing_fails(
    docker_client: Any, torch_locks: Path, tmp_path: Path
) -> None:
    done = envbuilder("build", "py3.11-cpu-torch2.12.0", "--locks", str(torch_locks))
    assert done.returncode == 1
    assert done.stdout == ""
    assert "py3.11-cpu-torch2.12.0: skipped, unsatisfiable" in done.stderr
    assert "nothing was built: every selected combination was skipped" in done.stderr


def test_all_builds_every_resolved_combination(
    docker_client: Any, base_image: str, wheel_cache: WheelCache, torch_locks: Path, tmp_path: Path
) -> None:
    done = envbuilder(
        "build", "--all", "--locks", str(torch_locks), "--log-dir", str(tmp_path / "logs"),
        "--wheel-cache", str(wheel_cache.root),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [torch_tag(torch_locks)]
    assert "1 image(s) ready, 1 combination(s) skipped" in done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1 only, storing under tmp_path."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed (sudo bash .ci/setup installs Debian's)")
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
        f"http:\n  addr: {address}\n"
        "log:\n  level: warn\n",
        encoding="utf-8",
    )
    log = (tmp_path / "registry.log").open("w")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{address}/v2/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    pytest.skip(
                        f"docker-registry exited: {(tmp_path / 'registry.log').read_text()[-500:]}"
                    )
                time.sleep(0.1)
        else:
            pytest.skip(f"docker-registry did not answer on {address}")
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_push_sends_the_image_to_the_registry(
    docker_client: Any,
    base_image: str,
    wheel_cache: WheelCache,
    torch_locks: Path,
    registry: str,
    tmp_path: Path,
) -> None:
    done = envbuilder(
        "build", TORCH_ID, "--locks", str(torch_locks), "--push", registry,
        "--log-dir", str(tmp_path / "logs"), "--wheel-cache", str(wheel_cache.root),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tag = torch_tag(torch_locks)
    repository, version = tag.split(":")
    assert done.stdout.split() == [tag, f"{registry}/{tag}"]
    with urllib.request.urlopen(f"http://{registry}/v2/{repository}/tags/list") as response:
        assert json.load(response) == {"name": repository, "tags": [version]}
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{version}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request) as response:
        pushed_layers = len(json.load(response)["layers"])
    assert pushed_layers == len(docker_client.images.get(tag).attrs["RootFS"]["Layers"])
    docker_client.images.remove(f"{registry}/{tag}")  # the local name of the pushed copy
