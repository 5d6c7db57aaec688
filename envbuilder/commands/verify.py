"""``envbuilder verify``: check a lockfile against the Sigstore bundle published beside it.

What is verified and what is not: `envbuilder.consumer.provenance` and docs/consumers.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.commands._lockfile_args import add_lock_argument

if TYPE_CHECKING:
    from envbuilder.consumer.provenance import Signer

HELP = "check that a lockfile is the one the GPU matrix workflow attested (Sigstore bundle)"


def add_signer_arguments(parser: argparse.ArgumentParser) -> None:
    """Who must have signed: the options `verify` and ``install --verify`` share."""
    from envbuilder.consumer.provenance import REF, WORKFLOW

    parser.add_argument(
        "--workflow",
        default=WORKFLOW,
        metavar="PATH",
        help=f"the workflow that must have signed, in that repository (default: {WORKFLOW})",
    )
    parser.add_argument(
        "--ref",
        default=REF,
        metavar="REF",
        help=f"the ref that workflow must have run on (default: {REF})",
    )
    parser.add_argument(
        "--trusted-root",
        type=Path,
        default=None,
        metavar="FILE",
        help="a Sigstore trusted root (JSON) to verify against, offline (default: Sigstore's "
        "public-good root, fetched and verified through TUF)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    parser.add_argument(
        "--repository",
        default=None,
        metavar="REPOSITORY",
        help="the GitHub repository (OWNER/NAME) whose workflow publishes the lockfile (default: "
        "$ENVBUILDER_VERIFY)",
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        default=None,
        metavar="FILE",
        help="the Sigstore bundle (default: <lockfile>.sigstore.json beside it, downloaded "
        "beside a URL)",
    )
    add_signer_arguments(parser)


def signer(repository: str | None, args: argparse.Namespace) -> Signer:
    """The expected `Signer` from *repository* and the shared options."""
    from envbuilder.consumer.provenance import Signer
    from envbuilder.errors import InputError

    if not repository:
        raise InputError(
            "whose attestation? give --repository OWNER/NAME (the repository whose GPU matrix "
            "workflow publishes the lockfile), or set $ENVBUILDER_VERIFY to it"
        )
    return Signer(repository=repository, workflow=args.workflow, ref=args.ref)


def run(args: argparse.Namespace) -> int:
    from envbuilder.consumer.provenance import verified_lockfile
    from envbuilder.reporter import Reporter

    expected = signer(args.repository or args.settings.verify, args)
    attested = verified_lockfile(
        args.lock,
        args.settings,
        expected,
        bundle=args.bundle,
        trusted_root=args.trusted_root,
    )
    Reporter(verbose=args.verbose).line(
        f"✓ {attested.path}: sha256 {attested.sha256[:12]} attested by "
        f"{expected.identity} (issuer {expected.issuer})"
    )
    return 0
