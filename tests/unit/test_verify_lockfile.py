"""``envbuilder verify`` and ``install --verify``: a lockfile counts only with its attestation.

A content hash anyone can recompute proves nothing about who wrote the file. These tests
sign under a trust root made here (tests/support/sigstore_root.py: a CA, a CT log and a
transparency log, all local) and run the sigstore library's verification against it,
offline: the genuine file verifies; a resealed or edited file, another signer, another
ref or issuer, an attacker's own CA and a missing bundle are each refused with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main
from envbuilder.consumer.provenance import Signer
from envbuilder.lockfile.canonical import seal
from tests.support.sigstore_root import LocalSigstore

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "acme/envbuilder"
GENUINE = Signer(repository=REPOSITORY)


@pytest.fixture(scope="module")
def sigstore() -> LocalSigstore:
    return LocalSigstore.create()


@pytest.fixture
def published(tmp_path: Path, sigstore: LocalSigstore) -> Path:
    """The committed lockfile as the release publishes it: with its bundle beside it."""
    lockfile = tmp_path / "compat.lock.json"
    shutil.copyfile(ROOT / "envbuilder" / "data" / "compat.lock.json", lockfile)  # tracked
    bundle = sigstore.attest(
        {"compat.lock.json": lockfile.read_bytes(), "compat-locks.tar.gz": b"archive"},
        identity=GENUINE.identity,
    )
    (tmp_path / "compat.lock.json.sigstore.json").write_bytes(bundle)
    sigstore.trusted_root(tmp_path / "trusted_root.json")
    return lockfile


def verify(lockfile: Path, *extra: str) -> int:
    root = lockfile.parent / "trusted_root.json"
    return main(["verify", "--lock", str(lockfile), "--trusted-root", str(root), *extra])


def resealed(lockfile: Path) -> None:
    """Make the first broken row verified and seal it again, as an attacker can."""
    data = json.loads(lockfile.read_bytes())
    for entry in data["combinations"]:
        entry["verdict"]["verdict"] = "verified"
    lockfile.write_bytes(seal(data))


def test_the_attested_lockfile_verifies(
    published: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify(published, "--repository", REPOSITORY) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"✓ {published}: sha256 ")
    assert f"attested by {GENUINE.identity}" in line


def test_envbuilder_verify_names_the_repository(
    published: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verify(published) == 2
    assert "give --repository OWNER/NAME" in capsys.readouterr().err
    monkeypatch.setenv("ENVBUILDER_VERIFY", REPOSITORY)
    assert verify(published) == 0


@pytest.mark.parametrize(
    ("change", "extra", "refusal"),
    [
        pytest.param(resealed, (), "is not among the attested subjects", id="resealed"),
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes() + b"\n"),
            (),
            "is not among the attested subjects",
            id="one-byte-appended",
        ),
        pytest.param(
            None, ("--repository", "fork/envbuilder"), "SANs do not match", id="other-repository"
        ),
        pytest.param(
            None, ("--workflow", ".github/workflows/ci.yml"), "SANs do not match", id="other-flow"
        ),
        pytest.param(None, ("--ref", "refs/heads/dev"), "SANs do not match", id="other-ref"),
    ],
)
def test_a_changed_file_or_another_signer_is_refused(
    published: Path,
    capsys: pytest.CaptureFixture[str],
    change: object,
    extra: tuple[str, ...],
    refusal: str,
) -> None:
    if callable(change):
        change(published)
    args = extra if "--repository" in extra else ("--repository", REPOSITORY, *extra)
    assert verify(published, *args) == 2
    err = capsys.readouterr().err
    assert refusal in err and "✓" not in err


@pytest.mark.parametrize(
    ("identity", "issuer"),
    [
        pytest.param(
            "https://github.com/fork/envbuilder/.github/workflows/gpu-matrix.yml@refs/heads/main",
            "https://token.actions.githubusercontent.com",
            id="signed-by-a-fork",
        ),
        pytest.param(GENUINE.identity, "https://accounts.example.test", id="other-issuer"),
    ],
)
def test_a_bundle_another_identity_signed_is_refused(
    published: Path,
    sigstore: LocalSigstore,
    capsys: pytest.CaptureFixture[str],
    identity: str,
    issuer: str,
) -> None:
    bundle = sigstore.attest(
        {"compat.lock.json": published.read_bytes()}, identity=identity, issuer=issuer
    )
    (published.parent / "compat.lock.json.sigstore.json").write_bytes(bundle)
    assert verify(published, "--repository", REPOSITORY) == 2
    assert "does not verify" in capsys.readouterr().err


def test_a_bundle_from_another_trust_root_is_refused(
    published: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An attacker's own CA and logs sign the genuine identity: not our trust root."""
    theirs = LocalSigstore.create().attest(
        {"compat.lock.json": published.read_bytes()}, identity=GENUINE.identity
    )
    (published.parent / "compat.lock.json.sigstore.json").write_bytes(theirs)
    assert verify(published, "--repository", REPOSITORY) == 2
    assert "does not verify" in capsys.readouterr().err


def test_no_bundle_beside_the_lockfile_is_refused(
    published: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (published.parent / "compat.lock.json.sigstore.json").unlink()
    assert verify(published, "--repository", REPOSITORY) == 2
    assert "no Sigstore bundle beside compat.lock.json" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["--verify", "ENVBUILDER_VERIFY"])
def test_install_with_verify_refuses_a_resealed_lockfile_before_installing(
    published: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    resealed(published)
    root = published.parent / "trusted_root.json"
    args = ["install", "--lock", str(published), "--trusted-root", str(root), "--dry-run"]
    if how == "--verify":
        args += ["--verify", REPOSITORY]
    else:
        monkeypatch.setenv("ENVBUILDER_VERIFY", REPOSITORY)
    assert main([*args, "--python", "3.11"]) == 2
    err = capsys.readouterr().err
    assert "is not among the attested subjects" in err
    assert "✓" not in err


def test_signer_refuses_a_malformed_identity() -> None:
    from envbuilder.errors import InputError

    with pytest.raises(InputError, match=re.escape("repository 'acme/../x'")):
        Signer(repository="acme/../x")
    with pytest.raises(InputError, match="workflow"):
        Signer(repository=REPOSITORY, workflow="../../evil.yml")
