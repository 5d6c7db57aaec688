"""The Docker daemon as a build sees it: the client and its timeouts, the images it
holds (a base pulled, a config and its layers loaded, a tag pushed), and the errors a
build raises.

A daemon that accepts the connection and never answers is an error after
`_QUICK_TIMEOUT_S` for the calls that answer at once, not a hang; the others
(loading a torch layer) may wait `_API_TIMEOUT_S`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from envbuilder.docker.client import DockerClient
from envbuilder.docker.layers import BaseImage, LayerChanged, chain_ids
from envbuilder.errors import EnvbuilderError, MissingToolError
from envbuilder.reporter import Reporter

__all__ = ["BuildFailed", "LayerGone", "docker_client", "inspect_base", "load_image", "push_image"]

_API_TIMEOUT_S = 3600  # loading a torch layer can take minutes without output
#: For the ping and the calls that answer at once (inspect, list, create): a daemon that
#: accepts the connection and never answers is an error after this, not a hang.
_QUICK_TIMEOUT_S = 60


class BuildFailed(EnvbuilderError):
    """The Docker build of a combination failed; the message names its log file."""


class LayerGone(BuildFailed):
    """A layer left out of ``docker load`` because the daemon had it is no longer there."""


def docker_client(
    client: DockerClient | None = None, *, quick_timeout_s: float | None = None
) -> DockerClient:
    """The given client, or one from the environment that answers a ping within
    ``quick_timeout_s`` (default `_QUICK_TIMEOUT_S`; a daemon that accepts the connection and never answers is an
    error, not a hang). Its other calls may wait `_API_TIMEOUT_S`; `_quick` shortens them."""
    if client is not None:
        return client
    quick_timeout_s = _QUICK_TIMEOUT_S if quick_timeout_s is None else quick_timeout_s
    import requests
    from docker import client as docker_py
    from docker.errors import DockerException

    try:
        found: DockerClient = docker_py.DockerClient.from_env(timeout=quick_timeout_s)
        found.ping()
    except (DockerException, requests.exceptions.RequestException) as e:
        raise MissingToolError(
            f"no Docker daemon answered within {quick_timeout_s:g} s ({e}); start one with "
            "`sudo bash .ci/setup` (installs and starts Docker) or run `dockerd` yourself, "
            "or point DOCKER_HOST at one"
        ) from e
    found.api.timeout = _API_TIMEOUT_S
    return found


#: Per thread: how many `_quick` blocks it holds open on each API client (by id). The
#: build's threads share one client; a block shortens its own thread's calls only, so a
#: long call another thread starts meanwhile (a log stream, a layer's load) keeps the
#: client's long timeout.
_QUICK_DEPTH = threading.local()
_HOOK_LOCK = threading.Lock()


def _depth() -> dict[int, int]:
    depth: dict[int, int] | None = getattr(_QUICK_DEPTH, "by_api", None)
    if depth is None:
        depth = _QUICK_DEPTH.by_api = {}
    return depth


def _hooked(api: object) -> bool:
    """Whether ``api`` gives the requests of a thread inside `_quick` the short timeout.

    docker-py sets each request's timeout in ``_set_request_timeout`` (the client's
    ``timeout`` unless the call names one); the hook, installed once per client, puts
    `_QUICK_TIMEOUT_S` there for those threads, or the client's own when that is shorter.
    False for a client without that method: its calls keep their own timeout."""
    with _HOOK_LOCK:
        if getattr(api, "_envbuilder_quick", False):
            return True
        original = getattr(api, "_set_request_timeout", None)
        if original is None:
            return False
        key = id(api)

        def set_request_timeout(kwargs: dict[str, object]) -> object:
            if _depth().get(key) and "timeout" not in kwargs:
                own = getattr(api, "timeout", None)
                short = _QUICK_TIMEOUT_S
                kwargs["timeout"] = own if isinstance(own, (int, float)) and own < short else short
            return original(kwargs)

        api._set_request_timeout = set_request_timeout  # type: ignore[attr-defined]
        api._envbuilder_quick = True  # type: ignore[attr-defined]
        return True


@contextmanager
def _quick(client: DockerClient) -> Iterator[None]:
    """This thread's calls inside give up after `_QUICK_TIMEOUT_S` (inspect, list: the
    daemon answers at once); other threads' calls keep the client's timeout."""
    api = getattr(client, "api", None)
    if api is None or not _hooked(api):
        yield
        return
    depth, key = _depth(), id(api)
    depth[key] = depth.get(key, 0) + 1
    try:
        yield
    finally:
        depth[key] -= 1
        if not depth[key]:
            del depth[key]


def inspect_base(client: DockerClient, ref: str) -> BaseImage:
    """The base image's id, layers, config and history, from the daemon."""
    with _quick(client):
        return BaseImage.from_inspect(ref, client.api.inspect_image(ref), client.api.history(ref))


def _daemon_chains(client: DockerClient) -> set[str]:
    """The chain ids of every image's layers: the layer stacks the daemon holds."""
    from docker.errors import ImageNotFound

    chains: set[str] = set()
    with _quick(client):
        for listed in client.api.images(all=True, quiet=True):
            try:  # another build may remove an image between the list and this look
                attrs = client.api.inspect_image(listed)
            except ImageNotFound:
                continue
            chains.update(chain_ids((attrs.get("RootFS") or {}).get("Layers") or ()))
    return chains


def load_image(client: DockerClient, chunks: Iterator[bytes]) -> None:
    """``docker load`` of an archive; raises BuildFailed with the daemon's error."""
    from docker.errors import APIError

    try:
        for item in client.api.load_image(chunks):
            if "error" in item:
                error = str(item["error"])
                if "layer.tar: no such file" in error:
                    raise LayerGone(
                        "a layer that the daemon held when the build began is gone "
                        f"(another image was removed): {error}"
                    )
                raise BuildFailed(f"docker load failed: {error}")
    except LayerChanged as e:
        raise LayerGone(f"a layer's tree changed after it was hashed: {e}") from e
    except APIError as e:
        if "layer.tar: no such file" in str(e):
            raise LayerGone(
                "a layer that the daemon held when the build began is gone "
                f"(another image was removed): {e}"
            ) from e
        raise BuildFailed(f"docker load failed: {e}") from e


def _image_id(client: DockerClient, ref: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        with _quick(client):
            return str(client.images.get(ref).id)
    except ImageNotFound:
        return None


def _remove_if_unused(client: DockerClient, image_id: str, reporter: Reporter) -> None:
    """Remove the image a build replaced when nothing names or runs it any more."""
    from docker.errors import APIError

    image = client.images.get(image_id)
    if image.tags or client.containers.list(all=True, filters={"ancestor": image_id}):
        return
    try:
        client.images.remove(image_id)
    except APIError as e:
        reporter.detail(f"the replaced image {image_id} stays: {e}")
        return
    reporter.detail(f"removed the replaced image {image_id}")


def _image_exists(client: DockerClient, ref: str) -> bool:
    return _image_id(client, ref) is not None


def _ensure_base(client: DockerClient, base: str, reporter: Reporter) -> None:
    if _image_exists(client, base):
        return
    from docker.errors import DockerException

    reporter.line(f"+ docker pull {base}")
    try:
        client.images.pull(base)
    except DockerException as e:
        raise MissingToolError(
            f"base image {base!r} is not on this machine and could not be pulled ({e}); "
            "pull or build it first (envbuilder/docker/recipe/make-base.sh makes a local Debian one), "
            "or choose another with base-image in matrix.toml / --base-image"
        ) from e


def push_image(
    client: DockerClient, tag: str, registry: str, *, reporter: Reporter | None = None
) -> str:
    """Push ``tag`` as ``<registry>/<tag>``; the pushed reference."""
    reporter = reporter or Reporter()
    remote = f"{registry.rstrip('/')}/{tag}"
    repository, _, version = remote.rpartition(":")
    client.images.get(tag).tag(repository, version)
    with reporter.step(f"push {remote}"):
        for item in client.api.push(repository, tag=version, stream=True, decode=True):
            if "error" in item:
                raise BuildFailed(f"docker push {remote} failed: {item['error']}")
            status = item.get("status")
            if status and item.get("id") is None:
                reporter.detail(str(status))
    return remote
