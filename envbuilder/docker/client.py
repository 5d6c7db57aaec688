"""The part of docker-py's client that envbuilder uses, as typed protocols.

docker-py ships no type information; these protocols name the calls the
image builder makes (``docker.DockerClient`` satisfies them), so that a
misspelt call or argument is a type error rather than a failure on a
machine with a daemon, and a test double knows what it must provide.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "DockerAPI",
    "DockerClient",
    "DockerContainer",
    "DockerContainers",
    "DockerImage",
    "DockerImages",
]


class DockerAPI(Protocol):
    """``client.api``: the low-level calls (inspect, history, list, load, push)."""

    timeout: float

    def inspect_image(self, image: str) -> dict[str, Any]: ...

    def history(self, image: str) -> list[dict[str, Any]]: ...

    def images(
        self, name: str | None = None, quiet: bool = False, all: bool = False, **kwargs: Any
    ) -> list[Any]: ...

    def containers(
        self, all: bool = False, filters: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> list[dict[str, Any]]: ...

    def remove_container(self, container: str, force: bool = False, **kwargs: Any) -> None: ...

    def load_image(self, data: Iterable[bytes], **kwargs: Any) -> Iterator[dict[str, Any]]: ...

    def push(self, repository: str, tag: str | None = None, **kwargs: Any) -> Any: ...

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]: ...


class DockerImage(Protocol):
    """One image (``client.images.get``)."""

    @property
    def id(self) -> str: ...

    @property
    def tags(self) -> list[str]: ...

    @property
    def attrs(self) -> dict[str, Any]: ...

    @property
    def labels(self) -> dict[str, str]: ...

    def tag(self, repository: str, tag: str | None = None, **kwargs: Any) -> bool: ...


class DockerImages(Protocol):
    """``client.images``."""

    def get(self, name: str) -> DockerImage: ...

    def remove(self, image: str, **kwargs: Any) -> None: ...

    def list(self, **kwargs: Any) -> list[DockerImage]: ...

    def pull(self, repository: str, tag: str | None = None, **kwargs: Any) -> Any: ...


class DockerContainer(Protocol):
    """One container (``client.containers.create``, ``.list``)."""

    @property
    def short_id(self) -> str: ...

    @property
    def labels(self) -> dict[str, str]: ...

    def start(self, **kwargs: Any) -> None: ...

    def logs(self, **kwargs: Any) -> Any: ...

    def wait(self, **kwargs: Any) -> dict[str, Any]: ...

    def remove(self, **kwargs: Any) -> None: ...


class DockerContainers(Protocol):
    """``client.containers``."""

    def create(
        self, image: str, command: str | Sequence[str] | None = None, **kwargs: Any
    ) -> DockerContainer: ...

    def run(self, image: str, command: str | Sequence[str] | None = None, **kwargs: Any) -> Any: ...

    def list(self, all: bool = False, **kwargs: Any) -> list[DockerContainer]: ...


class DockerClient(Protocol):
    """What envbuilder uses of ``docker.DockerClient``."""

    @property
    def api(self) -> DockerAPI: ...

    @property
    def images(self) -> DockerImages: ...

    @property
    def containers(self) -> DockerContainers: ...

    def ping(self) -> bool: ...
