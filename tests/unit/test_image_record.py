"""The record that hands a pushed image from the build job to the conformance jobs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from envbuilder.docker.registry import ImageRecord, registry_reference
from envbuilder.errors import InputError

LOCK = "ab" * 32
DIGEST = "sha256:" + "cd" * 32
GOOD: dict[str, Any] = {
    "combination": "py3.11-cpu-torch2.13.0",
    "lock_sha256": LOCK,
    "image_id": "sha256:" + "ef" * 32,
    "reference": f"registry.internal:5000/gpu/envbuilder/py3.11-cpu-torch2.13.0@{DIGEST}",
}


def test_a_record_round_trips_and_names_its_registry() -> None:
    record = ImageRecord.from_json(GOOD)
    assert ImageRecord.loads(record.dumps()) == record
    assert record.registry == "registry.internal:5000/gpu"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reference": GOOD["reference"].replace("@" + DIGEST, ":abababababab")}, "is not"),
        ({"reference": GOOD["reference"].replace("py3.11-cpu", "py3.12-cpu")}, "is not"),
        ({"reference": "https://user:pw@host/envbuilder/py3.11-cpu-torch2.13.0@" + DIGEST}, "is not"),
        ({"reference": "https://host/envbuilder/py3.11-cpu-torch2.13.0@" + DIGEST}, "not host"),
        ({"image_id": "ef" * 32}, "image_id"),
        ({"lock_sha256": "AB" * 32}, "lock_sha256"),
        ({"combination": 3}, "combination is not a string"),
        ({"extra": "x"}, "exactly"),
    ],
)  # fmt: skip
def test_a_record_that_names_no_single_image_is_refused(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        ImageRecord.from_json({**GOOD, **change})


def test_a_record_that_is_not_json_is_refused() -> None:
    with pytest.raises(InputError, match="not JSON"):
        ImageRecord.loads("{", source="image-x.json")
    assert json.loads(ImageRecord.from_json(GOOD).dumps()) == GOOD


@pytest.mark.parametrize(
    ("registry", "ok"),
    [
        ("127.0.0.1:5000", True),
        ("registry.internal/", True),
        ("[::1]:5000/gpu/images", True),
        ("http://registry.internal", False),
        ("user:pw@registry.internal", False),
        ("registry.internal/Upper", False),
        ("", False),
    ],
)
def test_registry_settings_are_host_port_and_path_only(registry: str, ok: bool) -> None:
    if ok:
        assert registry_reference(registry) == registry.rstrip("/")
    else:
        with pytest.raises(InputError, match="not host"):
            registry_reference(registry)


@pytest.mark.parametrize(
    ("lock_text", "registry", "kept"),
    [
        ("the lock", "registry.internal:5000/gpu", True),
        ("the lock", "registry.internal:5000/gpu/", True),
        ("a lock that moved", "registry.internal:5000/gpu", False),  # rebuilt: the lock changed
        ("the lock", "other.internal:5000/gpu", False),  # rebuilt: pushed elsewhere
    ],
)
def test_build_keeps_a_record_only_for_the_same_lock_and_registry(
    tmp_path: Path, lock_text: str, registry: str, kept: bool
) -> None:
    from envbuilder.commands.build import _kept_record

    lock = tmp_path / "pylock.toml"
    lock.write_text(lock_text, encoding="utf-8")
    record = {**GOOD, "lock_sha256": hashlib.sha256(b"the lock").hexdigest()}
    path = tmp_path / "records" / f"{GOOD['combination']}.json"
    path.parent.mkdir()
    path.write_text(ImageRecord.from_json(record).dumps(), encoding="utf-8")
    assert _kept_record(path, lock, registry) == (GOOD["reference"] if kept else None)
    assert _kept_record(tmp_path / "records" / "absent.json", lock, registry) is None
