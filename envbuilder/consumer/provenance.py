"""Whether a lockfile is one the GPU matrix workflow attested (``envbuilder verify``).

A content hash proves a lockfile is intact, not who wrote it: anyone can reseal an edited
file with envbuilder's own functions. The aggregate job of the GPU matrix workflow attests
what it publishes (``actions/attest-build-provenance``) and the release carries that
attestation beside the lockfile as ``compat.lock.json.sigstore.json``: a Sigstore bundle
whose DSSE envelope holds an in-toto statement naming the lockfile's sha256 among its
subjects, signed with a short-lived certificate that the Sigstore CA (Fulcio) issued to the
workflow's OIDC identity, and logged in the transparency log (Rekor).

======================================  ==============================================
what is checked                         by
======================================  ==============================================
the certificate chains to the trust     the ``sigstore`` library (`Verifier`), against
root's CA and was valid when the        Sigstore's public trust root (fetched and
entry was logged; its SCT; the log      verified through TUF) or ``trusted_root``
entry's inclusion proof, checkpoint
and promise; the envelope's signature
the certificate's identity: the         the library's policy, with `Signer`: the
workflow file at a ref of the           certificate's URI SAN and its OIDC issuer
expected repository, from GitHub
Actions' OIDC issuer
the statement names this file's         here (`verify_file`): an in-toto statement with
sha256                                  a subject of exactly these bytes
======================================  ==============================================

Not checked: which run made the file, or that it is the newest release (an older attested
lockfile verifies too); the pylocks and wheels it names are checked by their sha256 in the
verified lockfile, as always.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.errors import InputError

if TYPE_CHECKING:
    from envbuilder.settings import Settings

__all__ = [
    "BUNDLE_SUFFIX",
    "GITHUB_ISSUER",
    "Attested",
    "ProvenanceError",
    "Signer",
    "bundle_beside",
    "verified_lockfile",
    "verify_file",
]

#: the name of a file's Sigstore bundle beside it: ``compat.lock.json.sigstore.json``
BUNDLE_SUFFIX = ".sigstore.json"
#: the OIDC issuer of GitHub Actions' tokens, which Fulcio records in the certificate
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
#: the workflow that attests the published lockfile, and the branch it publishes from
WORKFLOW = ".github/workflows/gpu-matrix.yml"
REF = "refs/heads/main"
IN_TOTO = "application/vnd.in-toto+json"

_REPOSITORY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
_WORKFLOW = re.compile(r"\.github/workflows/[A-Za-z0-9._-]+\.ya?ml")
_REF = re.compile(r"refs/(?:heads|tags)/[A-Za-z0-9._/-]+")


class ProvenanceError(InputError):
    """A file whose attestation is missing, malformed, or not the expected signer's."""


@dataclass(frozen=True, kw_only=True)
class Signer:
    """Who must have signed: a workflow of a repository at a ref, through an OIDC issuer."""

    repository: str  # OWNER/NAME
    workflow: str = WORKFLOW
    ref: str = REF
    issuer: str = GITHUB_ISSUER

    def __post_init__(self) -> None:
        for name, value, pattern in (
            ("repository", self.repository, _REPOSITORY),
            ("workflow", self.workflow, _WORKFLOW),
            ("ref", self.ref, _REF),
        ):
            if not pattern.fullmatch(value) or ".." in value:
                raise InputError(f"expected signer: {name} {value!r} is not a valid {name}")
        if not self.issuer.startswith("https://"):
            raise InputError(f"expected signer: issuer {self.issuer!r} is not an https URL")

    @property
    def identity(self) -> str:
        """The URI SAN Fulcio writes into a GitHub Actions workflow's certificate."""
        return f"https://github.com/{self.repository}/{self.workflow}@{self.ref}"


@dataclass(frozen=True, kw_only=True)
class Attested:
    """A file verified against its bundle: its digest, who signed, and what was stated."""

    path: Path
    sha256: str
    signer: Signer
    predicate_type: str
    subjects: tuple[str, ...]  # the statement's subject names


def bundle_beside(path: Path) -> Path:
    """Where the bundle of *path* is published: beside it, named ``<name>.sigstore.json``."""
    return path.with_name(path.name + BUNDLE_SUFFIX)


def _subject_names(payload: bytes, digest: str, path: Path) -> tuple[str, str, tuple[str, ...]]:
    """The statement's predicate type, the name of the subject with *digest*, and all names;
    a `ProvenanceError` when no subject has it."""
    try:
        statement = json.loads(payload)
        subjects = statement["subject"]
        predicate = str(statement.get("predicateType", ""))
        names = tuple(str(s.get("name", "")) for s in subjects)
        matching = [
            str(s.get("name", "")) for s in subjects if s.get("digest", {}).get("sha256") == digest
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProvenanceError(f"{path}: the attested statement is not an in-toto one: {e}") from e
    if not matching:
        raise ProvenanceError(
            f"{path}: its sha256 {digest} is not among the attested subjects "
            f"({', '.join(names) or 'none'}): the file is not the one that was attested"
        )
    return predicate, matching[0], names


def verify_file(
    path: Path, *, bundle: Path, signer: Signer, trusted_root: Path | None = None
) -> Attested:
    """Verify that *bundle* attests the bytes of *path* and was signed by *signer*.

    *trusted_root* is a Sigstore trusted root (JSON) to verify against offline; without
    it, Sigstore's public-good root, which the library fetches and verifies through TUF.
    """
    from envbuilder.extras import require

    require("sigstore", extra="verify", needed_for="verifying a lockfile's attestation")
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle, TrustedRoot
    from sigstore.verify import Verifier
    from sigstore.verify.policy import AllOf, Identity, OIDCIssuerV2

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ProvenanceError(f"{path}: cannot read it ({e.strerror or e})") from e
    try:
        raw = bundle.read_bytes()
    except FileNotFoundError as e:
        raise ProvenanceError(
            f"{bundle}: no Sigstore bundle beside {path.name}; the release publishes it as "
            f"{path.name}{BUNDLE_SUFFIX} (or pass --bundle FILE)"
        ) from e
    digest = hashlib.sha256(data).hexdigest()
    try:
        parsed = Bundle.from_json(raw)
        if trusted_root is not None:
            verifier = Verifier(trusted_root=TrustedRoot.from_file(str(trusted_root)))
        else:
            verifier = Verifier.production()
        policy = AllOf([OIDCIssuerV2(signer.issuer), Identity(identity=signer.identity)])
        payload_type, payload = verifier.verify_dsse(parsed, policy)
    except (SigstoreError, ValueError) as e:
        raise ProvenanceError(f"{path}: its attestation {bundle} does not verify: {e}") from e
    if payload_type != IN_TOTO:
        raise ProvenanceError(
            f"{path}: the attestation holds {payload_type!r}, not an in-toto statement"
        )
    predicate, _, names = _subject_names(payload, digest, path)
    return Attested(
        path=path, sha256=digest, signer=signer, predicate_type=predicate, subjects=names
    )


def _fetch(url: str, to: Path, settings: Settings) -> None:
    from envbuilder.credentials import redact_text
    from envbuilder.errors import IndexError_
    from envbuilder.files import write_atomic

    try:
        with settings.http_client() as client:
            body = client.get(url).content
    except IndexError_ as e:
        raise ProvenanceError(
            f"cannot download the Sigstore bundle {redact_text(url)}: {e}; the release "
            "publishes it beside the lockfile"
        ) from e
    write_atomic(to, body)


def verified_lockfile(
    value: str | None,
    settings: Settings,
    signer: Signer,
    *,
    bundle: Path | None = None,
    trusted_root: Path | None = None,
    with_locks: bool = False,
    combination: str | None = None,
) -> Attested:
    """The lockfile *value* names (as ``--lock`` does: a file, an https URL, else
    ``$ENVBUILDER_LOCK``, ``$ENVBUILDER_LOCK_URL``, ``./compat.lock.json``), verified against
    its bundle: *bundle*, else the one published beside it (downloaded beside a URL's copy).
    The snapshot a wheel carries has no bundle: verifying it is refused."""
    from envbuilder.consumer.published import is_url, lockfile_argument
    from envbuilder.lockfile.read import default_lockfile

    url = value if value is not None and is_url(value) else None
    if value is None and settings.lockfile is None and settings.lock_url:
        url = settings.lock_url
    if url is not None:
        path = lockfile_argument(
            url, settings, with_locks=with_locks, combination=combination, option="--lock"
        )
        if bundle is None:
            bundle = bundle_beside(path)
            _fetch(url + BUNDLE_SUFFIX, bundle, settings)
    else:
        path = Path(value) if value is not None else default_lockfile(settings)
        if not path.is_file():
            raise ProvenanceError(
                f"{path}: no such lockfile to verify; the snapshot an envbuilder wheel carries "
                "has no attestation: give the published lockfile (--lock URL) or a file with "
                f"its {BUNDLE_SUFFIX} beside it"
            )
    return verify_file(
        path, bundle=bundle or bundle_beside(path), signer=signer, trusted_root=trusted_root
    )
