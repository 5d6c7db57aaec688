"""`verified_lock`: a lock is used only when its bytes are the ones ``resolution.json`` records."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from envbuilder.errors import InputError
from envbuilder.model import verified_lock

LOCK = b'lock-version = "1.0"\n'
SHA = hashlib.sha256(LOCK).hexdigest()


@pytest.mark.parametrize(
    ("recorded", "written", "refused"),
    [
        (SHA, LOCK, None),
        (None, LOCK, None),  # the resolution records no hash: nothing to compare
        (SHA, LOCK + b"# edited\n", f"differs from {SHA!r} in the resolution"),
        ("0" * 64, LOCK, "the lock changed after resolving, run `nox -s resolve` again"),
        (SHA, None, "lock not found; run `nox -s resolve`"),
    ],
)
def test_a_lock_is_the_one_resolved_or_refused(
    tmp_path: Path, recorded: str | None, written: bytes | None, refused: str | None
) -> None:
    lock = tmp_path / "pylock.x.toml"
    if written is not None:
        lock.write_bytes(written)
    if refused is None:
        assert verified_lock(lock, recorded) == hashlib.sha256(LOCK).hexdigest()
    else:
        with pytest.raises(InputError, match=re.escape(refused)):
            verified_lock(lock, recorded)
