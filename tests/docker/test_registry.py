"""Images built once per fleet: pushed by digest to a registry, pulled by that digest and
checked before anything measures them (``envbuilder/docker/registry.py``).

The registry is ``tests/support/registry.py`` on loopback (nothing can be pulled from
the internet here); the image is a tiny one made with ``docker import``, labelled as a
build labels a combination's image.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.registry import (
    ImageRecord,
    PullRefused,
    pull_verified,
    push_by_digest,
)
from tests.support.registry import RegistryServer

COMBINATION = "py3.11-cpu-torch2.13.0"
LOCK = "c0ffee" + "0" * 58


def imported(client: Any, content: bytes, *, combination: str, lock: str) -> str:
    """An image of one file, labelled with a combination and lock: its id."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("envbuilder.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    changes = [
        f"LABEL io.envbuilder.combination.id={combination}",
        f"LABEL io.envbuilder.lock.sha256={lock}",
    ]
    result = client.api.import_image_from_data(buffer.getvalue(), changes=changes)
    image_id = str(json.loads(result.strip().splitlines()[-1])["status"])
    assert image_id.startswith("sha256:")
    return image_id


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path / "registry") as server:
        yield server


@pytest.fixture
def made(docker_client: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """The image "this job built" (unique bytes per test, so no earlier copy exists)."""
    image_id = imported(docker_client, request.node.nodeid.encode(), combination=COMBINATION, lock=LOCK)  # fmt: skip
    yield image_id
    docker_client.images.remove(image_id, force=True)


def test_an_image_pushed_by_digest_comes_back_as_the_same_image(
    docker_client: Any, registry: RegistryServer, made: str
) -> None:
    record = push_by_digest(
        docker_client, made, combination=COMBINATION, lock_sha256=LOCK, registry=registry.address
    )
    repository = f"envbuilder/{COMBINATION}"
    assert record.reference.startswith(f"{registry.address}/{repository}@sha256:")
    assert registry.tags(repository) == [LOCK[:12]]
    # the record survives its trip as an artifact
    assert ImageRecord.loads(record.dumps()) == record
    # another runner: the daemon holds nothing of it until the pull
    docker_client.images.remove(made, force=True)
    pulled = pull_verified(
        docker_client,
        record,
        combination=COMBINATION,
        lock_sha256=LOCK,
        registry=registry.address,
    )
    assert pulled == made
    # by digest, never by tag
    manifest_gets = [p for m, p in registry.requests if m == "GET" and "/manifests/" in p]
    assert manifest_gets and all("/manifests/sha256:" in p for p in manifest_gets)


def test_a_tag_moved_in_the_registry_does_not_change_what_the_record_pulls(
    docker_client: Any, registry: RegistryServer, made: str
) -> None:
    record = push_by_digest(
        docker_client, made, combination=COMBINATION, lock_sha256=LOCK, registry=registry.address
    )
    planted = imported(docker_client, b"planted", combination=COMBINATION, lock=LOCK)
    try:
        forged = push_by_digest(
            docker_client, planted, combination=COMBINATION, lock_sha256=LOCK,
            registry=registry.address,
        )  # fmt: skip
        assert forged.reference != record.reference  # the tag now names the planted image
        docker_client.images.remove(made, force=True)
        pulled = pull_verified(docker_client, record, combination=COMBINATION, lock_sha256=LOCK)
        assert pulled == made
    finally:
        docker_client.images.remove(planted, force=True)


def test_a_record_naming_another_image_than_its_digest_holds_is_refused(
    docker_client: Any, registry: RegistryServer, made: str
) -> None:
    genuine = push_by_digest(
        docker_client, made, combination=COMBINATION, lock_sha256=LOCK, registry=registry.address
    )
    other = imported(docker_client, b"other", combination=COMBINATION, lock=LOCK)
    try:
        lying = ImageRecord(
            combination=COMBINATION, lock_sha256=LOCK, image_id=other, reference=genuine.reference
        )
        with pytest.raises(PullRefused, match="not measured"):
            pull_verified(docker_client, lying, combination=COMBINATION, lock_sha256=LOCK)
    finally:
        docker_client.images.remove(other, force=True)


def test_an_image_labelled_with_another_lock_is_refused(
    docker_client: Any, registry: RegistryServer
) -> None:
    stale = "ba5e" + "1" * 60
    # the image of an older lock, pushed under this lock's name by a confused build
    image = imported(docker_client, b"older lock", combination=COMBINATION, lock=stale)
    try:
        record = push_by_digest(
            docker_client, image, combination=COMBINATION, lock_sha256=LOCK,
            registry=registry.address,
        )  # fmt: skip
        with pytest.raises(PullRefused, match=f"at lock {stale}, not {COMBINATION} at lock"):
            pull_verified(docker_client, record, combination=COMBINATION, lock_sha256=LOCK)
    finally:
        docker_client.images.remove(image, force=True)
