"""Images shared through a registry: pushed once by digest, pulled by that digest and checked.

A fleet builds each combination's image once: the build job pushes it to the
registry the runners share (``ENVBUILDER_REGISTRY``, ``host[:port][/path]``)
and writes an ``ImageRecord``: the combination, its lock's sha256, the image id
(the sha256 of its config, which lists every layer's digest) and the reference
by manifest digest, ``<registry>/envbuilder/<id>@sha256:<digest>``. A
conformance job pulls that reference, never a tag: the daemon checks every
byte it fetches against the digest, and ``pull_verified`` then checks that the
image it holds is the record's id and carries the record's lock and
combination in its labels, and runs it by that id. A tag can be moved by
anyone who can push; a digest names one set of bytes.

The record is what the chain of custody rests on: the workflow hands it from
the build job to the conformance jobs of the same run as an artifact, attested
by the build job (docs/docker.md, "Images built once per fleet").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envbuilder.docker.client import DockerClient
from envbuilder.errors import EnvbuilderError, InputError
from envbuilder.model import image_tag
from envbuilder.reporter import Reporter

__all__ = [
    "ImageRecord",
    "PullRefused",
    "PushFailed",
    "pull_verified",
    "push_by_digest",
    "registry_auth",
    "registry_reference",
]

#: The registry's settings a job reads from its environment (secrets or variables).
REGISTRY_VARIABLE = "ENVBUILDER_REGISTRY"
USER_VARIABLE = "ENVBUILDER_REGISTRY_USER"
PASSWORD_VARIABLE = "ENVBUILDER_REGISTRY_PASSWORD"  # or a token

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: ``host[:port]`` and an optional path of lowercase repository components; no scheme,
#: no userinfo, no tag (``docker login`` holds the credentials).
_REGISTRY = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
)
_LABEL = "io.envbuilder"


class PushFailed(EnvbuilderError):
    """``docker push`` failed, or the registry named no digest for what it stored."""


class PullRefused(EnvbuilderError):
    """A pulled image is not the one its record names; it is not measured."""


def registry_reference(registry: str) -> str:
    """``registry`` checked: ``host[:port][/path]``, without a scheme, credentials or slash
    at the end."""
    value = registry.strip().rstrip("/")
    if not _REGISTRY.fullmatch(value):
        raise InputError(
            f"registry {registry!r} is not host[:port][/path] (e.g. registry.example:5000/gpu);"
            " give no scheme and no credentials (docker login holds those)"
        )
    return value


def registry_auth(environ: Mapping[str, str]) -> dict[str, str] | None:
    """Credentials for the registry from ``ENVBUILDER_REGISTRY_USER`` and
    ``ENVBUILDER_REGISTRY_PASSWORD``, handed to the daemon with each push and pull (no
    ``docker login``, so nothing is left in the runner's home); None without a user."""
    user = environ.get(USER_VARIABLE, "")
    if not user:
        return None
    password = environ.get(PASSWORD_VARIABLE, "")
    if not password:
        raise InputError(f"{USER_VARIABLE} is set and {PASSWORD_VARIABLE} is empty")
    return {"username": user, "password": password}


@dataclass(frozen=True, kw_only=True)
class ImageRecord:
    """What the build job pushed: the image of one combination's lock, by digest."""

    combination: str
    lock_sha256: str
    image_id: str  # sha256:<config digest>, what the daemon calls the image
    reference: str  # <registry>/envbuilder/<id>@sha256:<manifest digest>

    def __post_init__(self) -> None:
        if not _SHA256.fullmatch(self.lock_sha256):
            raise InputError(f"image record: lock_sha256 {self.lock_sha256!r} is not a sha256")
        if not _DIGEST.fullmatch(self.image_id):
            raise InputError(f"image record: image_id {self.image_id!r} is not sha256:<64 hex>")
        name, at, digest = self.reference.partition("@")
        repository = image_tag(self.combination, self.lock_sha256).rpartition(":")[0]
        if not at or not _DIGEST.fullmatch(digest) or not name.endswith("/" + repository):
            raise InputError(
                f"image record: reference {self.reference!r} is not"
                f" <registry>/{repository}@sha256:<64 hex>"
            )
        registry_reference(name.removesuffix("/" + repository))

    @property
    def registry(self) -> str:
        return self.reference.partition("@")[0].removesuffix(
            "/" + image_tag(self.combination, self.lock_sha256).rpartition(":")[0]
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "combination": self.combination,
            "lock_sha256": self.lock_sha256,
            "image_id": self.image_id,
            "reference": self.reference,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: object, *, source: str = "image record") -> ImageRecord:
        keys = ("combination", "lock_sha256", "image_id", "reference")
        if not isinstance(data, dict) or sorted(data) != sorted(keys):
            raise InputError(f"{source}: expected an object with exactly {', '.join(keys)}")
        values = {k: data[k] for k in keys}
        bad = [k for k, v in values.items() if not isinstance(v, str)]
        if bad:
            raise InputError(f"{source}: {bad[0]} is not a string")
        return cls(**values)

    @classmethod
    def loads(cls, text: str, *, source: str = "image record") -> ImageRecord:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InputError(f"{source}: not JSON ({e})") from e
        return cls.from_json(data, source=source)


def push_by_digest(
    client: DockerClient,
    image_id: str,
    *,
    combination: str,
    lock_sha256: str,
    registry: str,
    auth: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> ImageRecord:
    """Push the image ``image_id`` (what this process built) as
    ``<registry>/envbuilder/<id>:<sha12>`` and record it by the manifest digest the
    registry stored it under."""
    reporter = reporter or Reporter()
    host = registry_reference(registry)
    repository, _, version = f"{host}/{image_tag(combination, lock_sha256)}".rpartition(":")
    client.images.get(image_id).tag(repository, version)
    digest: str | None = None
    with reporter.step(f"push {repository}:{version}"):
        options: dict[str, Any] = {} if auth is None else {"auth_config": dict(auth)}
        for item in client.api.push(repository, tag=version, stream=True, decode=True, **options):
            if "error" in item:
                raise PushFailed(f"docker push {repository}:{version} failed: {item['error']}")
            aux = item.get("aux") or {}
            if isinstance(aux, dict) and _DIGEST.fullmatch(str(aux.get("Digest", ""))):
                digest = str(aux["Digest"])
    if digest is None:  # older daemons say it only in the image's RepoDigests
        for named in client.api.inspect_image(image_id).get("RepoDigests") or []:
            name, _, found = str(named).partition("@")
            if name == repository and _DIGEST.fullmatch(found):
                digest = found
    if digest is None:
        raise PushFailed(f"the registry named no digest for {repository}:{version}")
    record = ImageRecord(
        combination=combination,
        lock_sha256=lock_sha256,
        image_id=image_id,
        reference=f"{repository}@{digest}",
    )
    reporter.line(f"pushed {record.reference} (image {image_id})")
    return record


def pull_verified(
    client: DockerClient,
    record: ImageRecord,
    *,
    combination: str,
    lock_sha256: str,
    registry: str | None = None,
    auth: Mapping[str, str] | None = None,
    reporter: Reporter | None = None,
) -> str:
    """Pull ``record``'s image by its digest and return its id, to run it by: only when
    the record is for this combination and lock (and ``registry``, where given), the
    daemon's image is the record's id, and its labels name the same lock and combination.
    Anything else is refused before a container starts."""
    reporter = reporter or Reporter()
    if (record.combination, record.lock_sha256) != (combination, lock_sha256):
        raise PullRefused(
            f"the image record is for {record.combination} at lock {record.lock_sha256[:12]},"
            f" not {combination} at lock {lock_sha256[:12]}: it names another image"
        )
    if registry is not None and record.registry != registry_reference(registry):
        raise PullRefused(f"the image record names registry {record.registry!r}, not {registry!r}")
    with reporter.step(f"pull {record.reference}"):
        client.images.pull(record.reference, auth_config=None if auth is None else dict(auth))
    attrs = client.api.inspect_image(record.reference)
    found = str(attrs.get("Id", ""))
    if found != record.image_id:
        raise PullRefused(
            f"{record.reference} is image {found}, not {record.image_id} as recorded; not measured"
        )
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    claimed = (labels.get(f"{_LABEL}.combination.id"), labels.get(f"{_LABEL}.lock.sha256"))
    if claimed != (combination, lock_sha256):
        raise PullRefused(
            f"{record.reference} is labelled {claimed[0]} at lock {claimed[1]},"
            f" not {combination} at lock {lock_sha256}; not measured"
        )
    reporter.line(f"✓ {record.reference} is image {found}, built from lock {lock_sha256[:12]}")
    return found
