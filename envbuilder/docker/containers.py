"""The containers a build runs: each one labelled with the process that made it,
its output streamed and its files handed to the user who runs envbuilder, and removed
when it ends, also when the build is interrupted. What builds killed before they could
clean up left (containers, images loaded early, stage directories) is swept by the next
build.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Protocol, TypeVar

from envbuilder.docker.client import DockerClient, DockerContainer, DockerImage
from envbuilder.docker.daemon import BuildFailed, _quick
from envbuilder.docker.identity import LABEL_PREFIX
from envbuilder.reporter import Reporter

__all__ = [
    "EARLY_ROLE",
    "OWNER_LABEL",
    "ROLE_LABEL",
    "build_error",
    "owner_gone",
    "owner_token",
    "remove_container",
    "remove_image_tag",
    "remove_stage",
    "run_container",
    "sweep_leftovers",
]

logger = logging.getLogger(__name__)

#: Labels of the containers a build runs: which process made it (`owner_token`), and
#: what for. A later build removes those whose process is gone (`sweep_leftovers`).
OWNER_LABEL = f"{LABEL_PREFIX}.build.owner"
ROLE_LABEL = f"{LABEL_PREFIX}.build.role"
_RUN_LABEL = f"{LABEL_PREFIX}.build.run"  # one container of the build
#: The role of an image a build loads before its own (`early_load`): labelled like a
#: container, and swept like one.
EARLY_ROLE = "early"
#: The file in a stage directory that names the process that made it.
_STAGE_OWNER = "owner"
#: The name of a process's directory of kept trees (beside the stages, and swept like them).
_KEPT_PREFIX = "envbuilder-kept-"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), "" where unknown: with the
    pid it names one process, not a later one that got the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _pid_namespace(pid: int | str = "self") -> str:
    """The inode of the process's PID namespace, "" where unknown: a process in a
    container on the host's network has the host's name but its own pids."""
    try:
        link = str(Path(f"/proc/{pid}/ns/pid").readlink())
    except OSError:
        return ""
    return "".join(c for c in link if c.isdigit())


def owner_token(pid: int | None = None) -> str:
    """``<host>:<pid>:<start time>:<pid namespace>`` of this process (or ``pid``)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}:{_pid_namespace()}"


def owner_gone(token: str) -> bool:
    """Whether the process ``token`` names has ended. A process of another host or of
    another PID namespace (a build in a container on the host's network), or a token that
    cannot be read, is taken as alive: only its own host and namespace can tell."""
    parts = token.split(":")
    if len(parts) not in (3, 4):
        return False
    host, pid_text, start = parts[:3]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    if len(parts) == 4 and parts[3] != _pid_namespace():
        return False
    pid = int(pid_text)
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now == "" or (start != "" and now != start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def run_container(
    client: DockerClient,
    image: str,
    command: list[str],
    *,
    log: IO[str],
    volumes: Mapping[str, Mapping[str, str]] | None = None,
    reporter: Reporter | None = None,
    network: str = "none",
    role: str = "check",
    environment: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> tuple[int, str]:
    """Run ``command`` as root in a container of ``image`` (without network unless told);
    its exit status and output (also written to ``log``). The container is removed, also
    when the build is interrupted (SIGINT, SIGTERM); one removed from outside while it
    runs is a `BuildFailed` that says so, and a failed removal never hides the error that
    ended the run. What it writes into the read-write ``volumes`` is given to the user
    who runs envbuilder (their uid:gid), who can then remove it. ``on_line`` sees each
    line of output as it comes."""
    volumes = dict(volumes or {})
    writable = [v["bind"] for v in volumes.values() if v.get("mode") == "rw"]
    entrypoint, arguments = command[:1], command[1:]
    if writable:
        owner = f"{os.getuid()}:{os.getgid()}"
        script = f'"$@"; status=$?; chown -R {owner} {" ".join(writable)} || exit 125; exit $status'
        entrypoint, arguments = ["sh", "-c", script, "sh"], command
    run = uuid.uuid4().hex
    try:
        with _quick(client):
            container = client.containers.create(
                image,
                arguments,
                entrypoint=entrypoint,
                user="0:0",
                network_mode=network,
                volumes=volumes,
                environment=dict(environment or {}),
                labels={OWNER_LABEL: owner_token(), ROLE_LABEL: role, _RUN_LABEL: run},
            )
    except BaseException:  # interrupted while the daemon made it: find it by its label
        with _quick(client):
            for made in client.api.containers(all=True, filters={"label": f"{_RUN_LABEL}={run}"}):
                client.api.remove_container(made["Id"], force=True)
        raise
    lines: list[str] = []
    try:
        with _quick(client):
            container.start()
        for chunk in container.logs(stream=True, follow=True):
            text = chunk.decode("utf-8", "replace")
            log.write(text)
            lines.append(text)
            if on_line is not None:
                for line in text.splitlines():
                    on_line(line)
            if reporter is not None:
                for line in text.splitlines():
                    if line.startswith(("install-group.sh:", "install-compiler.sh:")):
                        reporter.line(f"    {line.split(': ', 1)[-1]}")
                    elif line.strip():
                        reporter.detail(line)
        status = _wait(container)
    except BaseException:
        if problem := remove_container(container):
            log.write(f"{problem}\n")
        raise
    problem = _discard(container)
    if problem == _GONE:
        raise BuildFailed(_removed_outside(container, f"it exited {status}"))
    if problem:
        raise BuildFailed(problem)
    log.flush()
    return status, "".join(lines)


def _removed_outside(container: DockerContainer, detail: object) -> str:
    return (
        f"the container {container.short_id} was removed by someone else while it ran "
        f"(`docker rm`, a prune?); nothing is built from it ({detail})"
    )


def _wait(container: DockerContainer) -> int:
    from docker.errors import NotFound

    try:
        return int(container.wait()["StatusCode"])
    except NotFound as e:
        raise BuildFailed(_removed_outside(container, e.explanation or e)) from e


#: What `_discard` says of a container that someone else removed (or is removing).
_GONE = "gone"


def _discard(container: DockerContainer) -> str | None:
    """Remove ``container``: None when done, `_GONE` when someone else removed it or is
    removing it, else what went wrong. Never raises but the interruption it was given: the
    error that ended the run stays the one the user sees.

    An interruption (Ctrl-C, SIGTERM) that lands inside the request may have kept it from
    the daemon: the container is removed once more before the interruption goes on."""
    try:
        return _remove(container)
    except KeyboardInterrupt:
        _remove(container)  # a second interruption ends this one too
        raise


def remove_container(container: DockerContainer) -> str | None:
    """Remove a container envbuilder ran (a build's, the suite's): None when it is gone,
    else what kept it (refused past `_REMOVE_PATIENCE_S`), for the user to remove by hand.
    Never raises but an interruption, after one more try."""
    problem = _discard(container)
    return None if problem == _GONE else problem


#: How long a removal the daemon refused (a kill it did not see end in time, on a loaded
#: machine) is tried again, and how long one already in progress is waited for.
_REMOVE_PATIENCE_S = 30.0
_REMOVE_RETRY_S = 0.5


def _remove(container: DockerContainer) -> str | None:
    """`_discard` without its interruption handling."""
    from docker.errors import APIError, NotFound

    deadline = time.monotonic() + _REMOVE_PATIENCE_S
    while True:
        try:
            container.remove(force=True)
        except NotFound:
            return _GONE
        except APIError as e:
            in_progress = e.status_code == 409 and "in progress" in str(e)
            if time.monotonic() >= deadline:
                return (
                    _GONE
                    if in_progress
                    else f"could not remove the container {container.short_id}: {e}"
                )
            time.sleep(_REMOVE_RETRY_S)
            continue
        return None


def remove_stage(client: DockerClient, stage: Path, *, image: str) -> None:
    """Remove the stage directory ``stage``. What a container killed before it could hand
    its files over left (root's files) is removed by root in a container of ``image``."""
    shutil.rmtree(stage, ignore_errors=True)
    if not stage.exists() or os.geteuid() == 0:
        return
    from docker.errors import DockerException

    try:
        client.containers.run(
            image,
            ["-c", "rm -rf /stage/* /stage/.[!.]* 2>/dev/null; true"],
            entrypoint=["sh"],
            user="0:0",
            network_mode="none",
            volumes={str(stage): {"bind": "/stage", "mode": "rw"}},
            labels={OWNER_LABEL: owner_token(), ROLE_LABEL: "cleanup"},
            remove=True,
        )
    except DockerException as e:
        logger.warning("cannot remove %s with a container: %s", stage, e)
    shutil.rmtree(stage, ignore_errors=True)


def remove_image_tag(client: DockerClient, tag: str) -> str | None:
    """Untag ``tag`` (its layers go with it where no other image holds them): None when
    done, else the daemon's refusal."""
    from docker.errors import DockerException

    try:
        with _quick(client):
            client.images.remove(tag)
    except DockerException as e:
        return str(e)
    return None


class _Labelled(Protocol):
    @property
    def labels(self) -> dict[str, str]: ...


_Found = TypeVar("_Found", bound=_Labelled)


def _of_ended_builds(found: Iterable[_Found]) -> Iterator[tuple[_Found, str]]:
    """Each of ``found`` whose `OWNER_LABEL` names a process that is gone, with that owner."""
    for thing in found:
        token = str((thing.labels or {}).get(OWNER_LABEL, ""))
        if owner_gone(token):
            yield thing, token


def sweep_leftovers(client: DockerClient, stages: Path, *, image: str, reporter: Reporter) -> None:
    """Remove what builds killed before they could clean up (SIGKILL, a lost machine) left:
    their containers (by `OWNER_LABEL`), the images they loaded early (`EARLY_ROLE`) and
    stage directories under ``stages``, where the process that made them is gone. Others'
    builds, running or not ours, are left alone."""
    from docker.errors import DockerException

    with _quick(client):
        found = client.containers.list(all=True, filters={"label": OWNER_LABEL})
    for container, token in _of_ended_builds(found):
        what = f"the container {container.short_id} of an ended build ({token})"
        if problem := remove_container(container):
            reporter.line(f"    {what} stays: {problem}")
        else:
            reporter.detail(f"removed {what}")
    early: list[DockerImage] = []
    try:
        with _quick(client):
            early = client.images.list(filters={"label": f"{ROLE_LABEL}={EARLY_ROLE}"})
    except DockerException as e:
        reporter.line(f"    cannot list early-loaded images: {e}")
    for loaded, token in _of_ended_builds(early):
        for tag in loaded.tags or [loaded.id]:
            if problem := remove_image_tag(client, tag):
                reporter.line(
                    f"    the early-loaded image {tag} of an ended build stays: {problem}"
                )
            else:
                reporter.detail(f"removed the early-loaded image {tag} of an ended build ({token})")
    left = [*stages.glob("envbuilder-build-*"), *stages.glob(f"{_KEPT_PREFIX}*")]
    for stage in sorted(left) if stages.is_dir() else ():
        try:
            token = (stage / _STAGE_OWNER).read_text(encoding="utf-8").strip()
        except OSError:
            continue  # not ours to judge (made before owners were recorded, or not a stage)
        if owner_gone(token):
            remove_stage(client, stage, image=image)
            if stage.exists():
                reporter.line(f"    the stage directory {stage} of an ended build stays; remove it")
            else:
                reporter.detail(f"removed the stage directory {stage} of an ended build ({token})")


def build_error(output: str) -> str:
    """What to say when the install failed: pip's errors (from its first ``ERROR:`` line,
    a hash mismatch included), else the last lines of the output."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("ERROR:")), None)
    shown = lines[first : first + 12] if first is not None else lines[-12:]
    return "\n  ".join(shown)


def _stop_containers(client: DockerClient, *, role: str) -> None:
    """Remove this process's running containers of ``role`` (their runs then fail)."""
    from docker.errors import DockerException

    mine = [f"{OWNER_LABEL}={owner_token()}", f"{ROLE_LABEL}={role}"]
    try:
        with _quick(client):
            for found in client.api.containers(all=True, filters={"label": mine}):
                client.api.remove_container(found["Id"], force=True)
    except DockerException as e:
        logger.warning("cannot remove this build's %s container: %s", role, e)
