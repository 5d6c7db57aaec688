"""``envbuilder query``: the lockfile's combinations that match, best first."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from envbuilder.lockfile.cli_args import add_lock_argument, add_selection_arguments

if TYPE_CHECKING:
    from envbuilder.lockfile.host import Host
    from envbuilder.lockfile.model import LastVerified
    from envbuilder.lockfile.query import Match, Query

HELP = "list the lockfile's combinations matching --python/--cuda/--torch/--gpu, best first (--use: by one use's verdict; --here: for this machine)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_lock_argument(parser)
    add_selection_arguments(parser)
    parser.add_argument(
        "--arch", help="CPU architecture of the host: x86_64 or aarch64 (amd64, arm64 accepted)"
    )
    parser.add_argument(
        "--driver",
        help="the host's NVIDIA driver version, e.g. 550.54.15: combinations whose CUDA "
        "release needs a newer one are rejected",
    )
    parser.add_argument(
        "--here",
        action="store_true",
        help="for this machine: detect Python, architecture, GPU and driver (NVML or "
        "nvidia-smi); explicit options override what is detected",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _last_verified(last: LastVerified | None) -> dict[str, object] | None:
    """When the verdict was last measured: its runs, or the stale evidence while the current
    lock has no runs of its own (``lock_sha256`` says which lock)."""
    if last is None:
        return None
    return {
        "date": last.date,
        "lock_sha256": last.lock_sha256,
        "suite_version": last.suite_version,
        "verdict": last.verdict.verdict,
        "uses": {u.use: u.verdict.verdict for u in last.uses},
        "text": last.describe(),
    }


def _query(args: argparse.Namespace, host: Host | None) -> Query:
    from envbuilder.lockfile.query import Query

    gpu = args.gpu
    if gpu is None and host is not None and host.gpus:
        gpu = host.gpus[0].compute_capability or host.gpus[0].name
    return Query(
        python=args.python or (host.python if host else None),
        cuda=args.cuda,
        torch=args.torch,
        xformers=args.xformers,
        gpu=gpu,
        use=args.use,
        arch=args.arch or (host.arch if host else None),
        driver=args.driver or (host.driver if host else None),
    )


def _match_json(m: Match) -> dict[str, object]:
    return {
        "id": m.entry.id,
        "python": m.entry.python,
        "cuda": m.entry.cuda,
        "platform": m.entry.platform,
        "arch": m.entry.arch,
        "cuda_release": m.entry.cuda_release,
        "minimum_driver": m.entry.minimum_driver,
        "torch": m.entry.torch,
        "xformers": m.entry.xformers,
        "compute_capability": m.compute_capability,
        "use": m.use,
        "verdict": m.verdict.verdict,
        "reason": m.verdict.reason,
        "workarounds": list(m.verdict.workarounds),
        "failing_checks": list(m.verdict.failing_checks),
        "choices": [asdict(c) for c in m.verdict.choices],
        "uses": {u.use: u.verdict.verdict for u in m.uses},
        "lock": m.entry.lock.path if m.entry.lock else None,
        "last_verified": _last_verified(m.entry.last_verified),
    }


def run(args: argparse.Namespace) -> int:
    from envbuilder.lockfile.gpus import gpu_arch
    from envbuilder.lockfile.host import detect_host
    from envbuilder.lockfile.published import lockfile_argument
    from envbuilder.lockfile.query import answer
    from envbuilder.lockfile.read import load_lockfile

    path = lockfile_argument(args.lock, args.settings)
    lock = load_lockfile(path)
    host = detect_host() if args.here else None
    query = _query(args, host)
    result = answer(lock, query)
    matches = result.matches
    # rejections are news when the host decides them (a Grace GPU implies aarch64) or when
    # nothing matched; a plain filter's misses are not
    host_query = bool(args.here or args.arch or args.driver or gpu_arch(args.gpu or ""))
    if args.json:
        listed = [_match_json(m) for m in matches]
        if host_query:
            out: object = {
                "host": None if host is None else asdict(host),
                "query": asdict(query),
                "matches": listed,
                "rejected": [
                    {"id": r.entry.id, "reasons": list(r.reasons)} for r in result.rejected
                ],
            }
        else:
            out = listed
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if matches else 1
    if host is not None:
        print(f"this machine: {host.describe()}")
        given = [
            f"--{k} {v}"
            for k, v in (
                ("python", args.python),
                ("arch", args.arch),
                ("gpu", args.gpu),
                ("driver", args.driver),
            )
            if v
        ]
        if given:
            print(f"overridden: {' '.join(given)}")
        if len({g.compute_capability for g in host.gpus}) > 1:
            print(f"judged for the first GPU, {host.gpus[0].name}")
    if matches:
        width = max(len(m.entry.id) for m in matches)
        if args.use:
            print(f"verdicts for {args.use}:")
        for m in matches:
            print(f"{m.verdict.verdict:<25} {m.entry.id:<{width}}  {m.verdict.reason}")
    else:
        print(f"no combination in {path} matches", file=sys.stderr)
    if (host_query or not matches) and result.rejected:
        print(f"{'not for this host' if host_query else 'not matching'} ({len(result.rejected)}):")
        for r in result.rejected:
            print(f"  {r.entry.id}: {r.reason}")
    return 0 if matches else 1
