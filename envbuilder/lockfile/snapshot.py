"""The lockfile snapshot the wheel carries, so that ``pip install gpu-envbuilder`` then
``envbuilder query`` answers without building anything.

``envbuilder/data/`` holds a published lockfile and the pylocks it names (at their
paths relative to it, as the site publishes them). It is generated, never edited:
``nox -s snapshot -- LOCKFILE|URL`` runs ``python -m envbuilder.lockfile.snapshot``,
which checks the lockfile (its content hash) and each pylock (its sha256) and
replaces the directory as a whole. The release builds the wheel after it. The
lockfile's own content hash makes any edit by hand fail on read.

The snapshot's date is that of the newest run it holds (the lockfile carries no
clock of its own: the same inputs give the same bytes).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path, PurePosixPath

from envbuilder.lockfile.model import DEFAULT_LOCKFILE, CompatLock

__all__ = ["embedded", "newest_evidence", "write_snapshot"]

#: the package directory of the snapshot
DATA = "data"
README = (
    "# The lockfile snapshot the wheel carries\n\n"
    "Written by `nox -s snapshot -- LOCKFILE|URL` (`python -m envbuilder.lockfile.snapshot`)"
    " from a published lockfile and its locks; never edit these files by hand (the lockfile's"
    " content hash and the locks' sha256 are checked on every read).\n"
)


def embedded() -> Path | None:
    """The snapshot's lockfile inside the installed package, when the wheel carries one."""
    path = Path(str(resources.files("envbuilder").joinpath(DATA, DEFAULT_LOCKFILE)))
    return path if path.is_file() else None


def newest_evidence(lock: CompatLock) -> str | None:
    """The day (YYYY-MM-DD) the newest run in *lock* finished; None without runs."""
    days = []
    for entry in lock.combinations:
        for run in entry.runs:
            try:
                days.append(datetime.fromisoformat(run.finished).date().isoformat())
            except ValueError:
                continue
    return max(days, default=None)


def write_snapshot(lockfile: Path, out: Path) -> list[Path]:
    """Copy *lockfile* and every pylock it names into *out*, replacing what was there;
    both are checked first, nothing is changed on a failure. Returns the files written."""
    from envbuilder.errors import InputError
    from envbuilder.lockfile.export import locate_pylock
    from envbuilder.lockfile.read import load_lockfile

    lock = load_lockfile(lockfile)
    files: dict[str, Path] = {DEFAULT_LOCKFILE: lockfile}
    for entry in lock.combinations:
        if entry.lock is not None:
            files[str(PurePosixPath(entry.lock.path))] = locate_pylock(lockfile, entry)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=out.parent))
    try:
        for name, source in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        (staging / "README.md").write_text(README, encoding="utf-8")
        if out.exists() and not (out / DEFAULT_LOCKFILE).is_file() and any(out.iterdir()):
            raise InputError(f"{out} holds other files than a snapshot; refusing to replace it")
        old = out.with_name(out.name + ".old")
        if out.exists():
            out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p for p in out.rglob("*") if p.is_file())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m envbuilder.lockfile.snapshot LOCKFILE|URL [OUT]`` (``nox -s snapshot``)."""
    import os

    from envbuilder.errors import EnvbuilderError
    from envbuilder.lockfile.published import lockfile_argument
    from envbuilder.lockfile.read import load_lockfile
    from envbuilder.settings import Settings

    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print("usage: python -m envbuilder.lockfile.snapshot LOCKFILE|URL [OUT]", file=sys.stderr)
        return 2
    out = Path(args[1]) if len(args) == 2 else Path(__file__).parents[1] / DATA
    try:
        settings = Settings.from_environment(os.environ)
        lockfile = lockfile_argument(args[0], settings, with_locks=True)
        written = write_snapshot(lockfile, out)
        day = newest_evidence(load_lockfile(lockfile)) or "no runs"
    except EnvbuilderError as e:
        print(f"snapshot: error: {e}", file=sys.stderr)
        return e.return_code
    print(f"wrote {out}: {len(written)} files, newest evidence {day}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
