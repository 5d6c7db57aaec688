"""A build cleans up after itself, whoever runs it and however it ends: as a user of the
``docker`` group, on SIGTERM, after a kill (the next build sweeps), when its container is
removed from outside, and when the daemon never answers."""

from __future__ import annotations

import grp
import io
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import envbuilder.docker.build as docker_build
import envbuilder.docker.daemon as docker_daemon
from envbuilder.docker.build import (
    BuildFailed,
    ImageRequest,
    docker_client,
    ensure_image,
    run_container,
)
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import lock_digest
from envbuilder.errors import MissingToolError
from envbuilder.model import Resolution, lock_filename
from envbuilder.reporter import Reporter
from tests.docker.conftest import resolved_record, write_lock
from tests.support.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
COMBINATION = "py3.11-cpu-torch9.7.0"


def cli_locks(root: Path, base_image: str, *, seed: int) -> Path:
    """``root/locks``: a matrix, resolution.json and the lock of one combination whose torch
    is a test-built wheel big enough that pip takes a while to install it."""
    wheels = root / "wheels"
    torch = build_wheel(wheels, "torch", "9.7.0", padding=48 * 2**20, seed=seed)
    locks = root / "locks"
    lock = write_lock(locks / lock_filename(COMBINATION), [torch])
    matrix = root / "matrix.toml"
    matrix.write_text(
        f'[defaults]\nbase-image = "{base_image}"\n[axes]\npython = ["3.11"]\n'
        '[[combinations]]\npython = "3.11"\ncuda = "cpu"\ntorch = "9.7.0"\n',
        encoding="utf-8",
    )
    resolution = Resolution(
        matrix=str(matrix),
        matrix_sha256=lock_digest(matrix.read_bytes()),
        combinations=(resolved_record(COMBINATION, lock, torch="9.7.0"),),
    )
    import json

    (locks / "resolution.json").write_text(json.dumps(resolution.to_json()), encoding="utf-8")
    return locks


def start_build(root: Path, locks: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "envbuilder", "build", COMBINATION, "--force", *options,
         "--locks", str(locks), "--wheel-cache", str(root / "cache" / "wheels"),
         "--log-dir", str(root / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "ENVBUILDER_CACHE_DIR": str(root / "cache")},
    )  # fmt: skip


def install_container(client: Any, root: Path, process: subprocess.Popen[str]) -> str:
    """The container that installs the wheels: the build's container that mounts ``root``
    with the install role (the compiler's container mounts it too, beside it, and may be
    done and removed before the build is killed)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        for found in mounting(client, root, role="install"):
            return found
        time.sleep(0.2)
    _, err = process.communicate(timeout=60) if process.poll() is not None else ("", "")
    pytest.fail(f"no install container appeared (build exit {process.poll()}): {err[-2000:]}")


def build_logs(root: Path) -> str:
    """The ends of the build's logs under ``root``: what its containers said, and what
    went wrong removing them."""
    return "".join(
        f"--- {log.name}\n{log.read_text(encoding='utf-8', errors='replace')[-3000:]}\n"
        for log in sorted((root / "logs").glob("*"))
        if log.is_file()
    )


def mounting(client: Any, root: Path, *, role: str | None = None) -> list[str]:
    """The ids of the containers that mount something under ``root`` (the daemon is shared:
    the list is read in one call, as others' containers come and go); with ``role``, only the
    build's containers of that role."""
    from envbuilder.docker.containers import ROLE_LABEL

    return [
        str(c["Id"])
        for c in client.api.containers(all=True)
        if any(str(m.get("Source", "")).startswith(str(root)) for m in c.get("Mounts") or [])
        and (role is None or (c.get("Labels") or {}).get(ROLE_LABEL) == role)
    ]


def container_exists(client: Any, container_id: str) -> bool:
    from docker.errors import NotFound

    try:
        client.containers.get(container_id)
    except NotFound:
        return False
    return True


@pytest.fixture
def build_root(docker_client: Any) -> Iterator[Path]:
    """A directory outside pytest's (root-only) temporary tree; its images and the
    containers that mount it are removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="envbuilder-cleanup-test-"))
    root.chmod(0o755)
    yield root
    for container in mounting(docker_client, root):
        docker_client.api.remove_container(container, force=True)
    for image in docker_client.images.list(name=f"envbuilder/{COMBINATION}"):
        docker_client.images.remove(image.id, force=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("after_s", [0, 3], ids=["as-it-starts", "while-it-runs"])
def test_sigterm_removes_the_install_container_and_the_stage(
    docker_client: Any, base_image: str, build_root: Path, after_s: float
) -> None:
    locks = cli_locks(build_root, base_image, seed=71)
    process = start_build(build_root, locks)
    container = install_container(docker_client, build_root, process)
    time.sleep(after_s)
    process.send_signal(signal.SIGTERM)  # what `timeout` and a cancelled CI job send
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "interrupted" in err
    assert not container_exists(docker_client, container), build_logs(build_root) + err[-2000:]
    assert list((build_root / "cache" / "wheels").glob("envbuilder-build-*")) == []


def test_the_next_build_sweeps_what_a_killed_build_left(
    docker_client: Any, base_image: str, build_root: Path
) -> None:
    locks = cli_locks(build_root, base_image, seed=72)
    process = start_build(build_root, locks)
    container = install_container(docker_client, build_root, process)
    process.kill()  # SIGKILL: nothing runs, everything stays
    process.wait(timeout=60)
    stages = list((build_root / "cache" / "wheels").glob("envbuilder-build-*"))
    assert len(stages) == 1
    assert container_exists(docker_client, container)

    from envbuilder.model import load_resolution

    resolved = load_resolution(locks / "resolution.json").by_id()[COMBINATION]
    request = ImageRequest(
        resolved=resolved,
        lock_path=locks / lock_filename(COMBINATION),
        base_image=base_image,
        log_dir=build_root / "logs",
        cache=WheelCache(build_root / "cache" / "wheels"),
    )
    ensure_image(request, reporter=Reporter(io.StringIO()))
    assert not container_exists(docker_client, container)
    assert not stages[0].exists()


def test_a_build_whose_image_exists_sweeps_what_a_killed_build_left_first(
    docker_client: Any, base_image: str, build_root: Path
) -> None:
    """The image is already what the lock makes; a killed rebuild's container and stage
    still go before anything else is looked at."""
    locks = cli_locks(build_root, base_image, seed=73)
    from envbuilder.model import load_resolution

    resolved = load_resolution(locks / "resolution.json").by_id()[COMBINATION]
    request = ImageRequest(
        resolved=resolved,
        lock_path=locks / lock_filename(COMBINATION),
        base_image=base_image,
        log_dir=build_root / "logs",
        cache=WheelCache(build_root / "cache" / "wheels"),
    )
    ensure_image(request, reporter=Reporter(io.StringIO()))
    process = start_build(build_root, locks, "--no-cache")  # installs, whatever was made before
    container = install_container(docker_client, build_root, process)
    process.kill()
    process.wait(timeout=60)
    (stage,) = (build_root / "cache" / "wheels").glob("envbuilder-build-*")
    out = io.StringIO()
    ensure_image(request, reporter=Reporter(out, verbose=1))
    assert not container_exists(docker_client, container), out.getvalue()
    assert not stage.exists()


def test_a_build_of_another_process_that_runs_is_not_swept(
    docker_client: Any, base_image: str, build_root: Path
) -> None:
    alive = subprocess.Popen(["sleep", "600"])
    try:
        stage = build_root / "wheels" / "envbuilder-build-other"
        stage.mkdir(parents=True)
        (stage / "owner").write_text(docker_build.owner_token(alive.pid), encoding="utf-8")
        docker_build.sweep_leftovers(
            docker_client, build_root / "wheels", image=base_image, reporter=Reporter(io.StringIO())
        )
        assert stage.is_dir()
    finally:
        alive.kill()
        alive.wait()
    docker_build.sweep_leftovers(
        docker_client, build_root / "wheels", image=base_image, reporter=Reporter(io.StringIO())
    )
    assert not stage.exists()


def test_a_container_removed_from_outside_is_the_error_not_the_cleanup(
    docker_client: Any, base_image: str
) -> None:
    marker = f"envbuilder-test-{uuid.uuid4().hex}"
    removed: list[str] = []

    def remove_it() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for container in docker_client.api.containers(filters={"ancestor": base_image}):
                if marker in str(container.get("Command")):
                    docker_client.api.remove_container(container["Id"], force=True)
                    removed.append(container["Id"])
                    return
            time.sleep(0.1)

    remover = threading.Thread(target=remove_it)
    remover.start()
    try:
        with pytest.raises(BuildFailed, match="was removed by someone else while it ran"):
            run_container(
                docker_client, base_image, ["sh", "-c", f"sleep 120 # {marker}"], log=io.StringIO()
            )
    finally:
        remover.join()
    assert removed


@pytest.fixture
def silent_daemon(tmp_path: Path) -> Iterator[str]:
    """A Unix socket that accepts connections and never answers."""
    path = tmp_path / "silent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"unix://{path}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_a_daemon_that_never_answers_is_an_error_not_a_hang(
    silent_daemon: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", silent_daemon)
    monkeypatch.setattr(docker_daemon, "_QUICK_TIMEOUT_S", 2)
    outcome: list[BaseException | object] = []

    def connect() -> None:
        try:
            outcome.append(docker_client())
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "docker_client() still waits for a daemon that never answers"
    assert isinstance(outcome[0], MissingToolError)
    assert "no Docker daemon answered within 2 s" in str(outcome[0])


#: What the process that builds as another user imports while it is still root: the test's
#: interpreter lies under /root, which that user cannot enter.
_AS_USER = """
import importlib, os, pkgutil, sys
import docker, docker.errors, docker.types, docker.models.containers, requests, platformdirs
import configparser, tempfile, tarfile, zipfile, json, hashlib, email.parser, encodings.idna
import envbuilder
for module in pkgutil.walk_packages(envbuilder.__path__, "envbuilder."):
    if not module.name.startswith("envbuilder.conformance"):
        importlib.import_module(module.name)
uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), [int(g) for g in sys.argv[3].split(",")]
os.setgroups(groups)
os.setgid(gid)
os.setuid(uid)
os.environ["HOME"] = sys.argv[4]
sys.exit(importlib.import_module("envbuilder.cli").main(sys.argv[5:]))
"""


@pytest.fixture
def docker_user() -> Iterator[pwd.struct_passwd]:
    """A user without privileges in the ``docker`` group, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making a user needs root")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    try:
        grp.getgrnam("docker")
    except KeyError:
        pytest.skip("there is no docker group to put the user in")
    name = f"ebtest{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "-G", "docker", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def test_a_user_of_the_docker_group_builds_and_owns_what_the_build_left(
    docker_client: Any, base_image: str, build_root: Path, docker_user: pwd.struct_passwd
) -> None:
    locks = cli_locks(build_root, base_image, seed=73)
    # envbuilder's source, where that user can read it (the checkout may be private)
    source = build_root / "src"
    shutil.copytree(REPO / "envbuilder", source / "envbuilder", ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for path in [build_root, *build_root.rglob("*")]:
        os.chown(path, docker_user.pw_uid, docker_user.pw_gid)
    groups = [docker_user.pw_gid, grp.getgrnam("docker").gr_gid]
    done = subprocess.run(
        [sys.executable, "-c", _AS_USER, str(docker_user.pw_uid), str(docker_user.pw_gid),
         ",".join(map(str, groups)), str(build_root),
         "build", COMBINATION, "--locks", str(locks),
         "--wheel-cache", str(build_root / "cache" / "wheels"), "--log-dir", str(build_root / "logs")],
        capture_output=True, text=True, timeout=1200, cwd=str(build_root),
        env={**os.environ, "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1", "ENVBUILDER_CACHE_DIR": str(build_root / "cache")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    foreign = [p for p in build_root.rglob("*") if p.lstat().st_uid != docker_user.pw_uid]
    assert foreign == []
    assert list((build_root / "cache" / "wheels").glob("envbuilder-build-*")) == []
