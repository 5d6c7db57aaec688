"""Plant each bug of ``plants.toml`` in a copy of the tree and run the tests meant to catch it.

A plant is one exact edit to one file: the text it replaces must occur there
exactly once, so a plant that no longer applies fails loudly instead of being
skipped. Every plant must be *killed*: its tests fail with the bug in place. A
plant that survives is a check that cannot fail, and this command exits 1. A
plant whose tests pass only because some were skipped here (no Docker daemon, no
fish) is "not run here", with the skip's reason: it says nothing either way and
fails nothing; list a plant's killing tests by id so that the rest do not hide it.
Before any plant, the same tests run on the unchanged copy and must pass, so a
kill is the bug's doing. The checkout itself is never modified.

    python tests/mutation/run.py [--plants FILE] [--changed [--base REF]] [NAME ...]

``--changed`` runs only the plants that local work can have touched: those whose
file, test files or their conftest.py changed since the merge base with ``--base``
(default: the branch's upstream, else origin/HEAD, else origin/main; HEAD itself,
that is uncommitted work only, when none exists), and those new or edited in the
plants file. A change to this runner selects them all. CI runs every plant.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANTS = Path(__file__).with_name("plants.toml")
#: this runner, as git names it: a change to it may change every plant's outcome
RUNNER = "tests/mutation/run.py"
#: where ``--changed`` measures from when no --base is given: the first that exists
BASE_CANDIDATES = ("@{upstream}", "origin/HEAD", "origin/main")


@dataclass(frozen=True, kw_only=True)
class Plant:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


def load_plants(path: Path) -> list[Plant]:
    return parse_plants(path.read_text(encoding="utf-8"), path)


def parse_plants(text: str, path: Path) -> list[Plant]:
    data = tomllib.loads(text)
    plants = []
    for name, item in data.items():
        unknown = set(item) - {"file", "find", "replace", "tests", "why"}
        if unknown:
            raise SystemExit(f"{path}: plant {name!r} has unknown keys {sorted(unknown)}")
        plants.append(
            Plant(
                name=name,
                file=item["file"],
                find=item["find"],
                replace=item["replace"],
                tests=tuple(item["tests"]),
                why=item["why"],
            )
        )
    return plants


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def merge_base(ref: str | None) -> tuple[str, str]:
    """The commit local work is measured from, and what it is: the merge base of HEAD and
    ``ref``, else of HEAD and the first of BASE_CANDIDATES that exists, else HEAD."""
    for candidate in (ref,) if ref is not None else BASE_CANDIDATES:
        done = _git("merge-base", "HEAD", candidate)
        if done.returncode == 0:
            return done.stdout.strip(), f"the merge base with {candidate}"
        if ref is not None:
            raise SystemExit(f"--base {ref!r}: {done.stderr.strip() or 'no merge base with HEAD'}")
    head = _git("rev-parse", "HEAD").stdout.strip()
    return head, "HEAD (no upstream, origin/HEAD or origin/main): uncommitted work only"


def changed_since(base: str) -> frozenset[str]:
    """Files that differ between ``base`` and the working tree, and untracked ones."""
    diff = _git("diff", "--name-only", "--no-renames", base)
    if diff.returncode != 0:
        raise SystemExit(f"git diff {base}: {diff.stderr.strip()}")
    untracked = _git("ls-files", "--others", "--exclude-standard").stdout
    return frozenset(filter(None, (*diff.stdout.splitlines(), *untracked.splitlines())))


def _inputs(plant: Plant) -> list[str]:
    """The paths a plant's outcome depends on: its file, its tests' files and their conftests."""
    paths = [plant.file]
    for test in plant.tests:
        path = test.split("::")[0].rstrip("/")
        paths.append(path)
        parents = Path(path).parents if path.endswith(".py") else (Path(path), *Path(path).parents)
        paths += [f"{d}/conftest.py" for d in parents if d.parts and d.parts[0] == "tests"]
    return paths


def touched_plants(
    plants: list[Plant], changed: frozenset[str], before: list[Plant]
) -> list[Plant]:
    """The plants local work can have touched: new or edited since ``before``, or with an
    input among ``changed`` (a test path that is a directory covers the files under it)."""
    if RUNNER in changed:
        return plants
    earlier = {p.name: p for p in before}

    def hit(path: str) -> bool:
        return path in changed or any(c.startswith(path + "/") for c in changed)

    return [p for p in plants if earlier.get(p.name) != p or any(map(hit, _inputs(p)))]


def plants_at(base: str, path: Path) -> list[Plant]:
    """The plants file as it was at ``base`` (none where it did not exist)."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    shown = _git("show", f"{base}:{rel}")
    return parse_plants(shown.stdout, path) if shown.returncode == 0 else []


def copy_tree(dest: Path) -> None:
    """The checkout's tracked and untracked-but-not-ignored files, copied to *dest*."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = ROOT / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


@dataclass(frozen=True, kw_only=True)
class TestRun:
    """One pytest run: its exit status, its last line, and why tests were skipped."""

    rc: int
    last: str
    skipped: int
    reasons: tuple[str, ...]  # each skip reason once, as pytest's -rs summary gives it
    failures: tuple[str, ...] = ()  # the -rfE summary's FAILED and ERROR lines


#: ``SKIPPED [2] tests/docker/conftest.py:31: no Docker daemon`` in the -rs summary
_SKIP = re.compile(r"^SKIPPED \[\d+\] [^:]+(?::\d+)?: (.*)$")
_SKIPPED = re.compile(r"\b(\d+) skipped\b")


def read_run(rc: int, stdout: str, stderr: str) -> TestRun:
    lines = [line for line in stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else stderr.strip()[-300:]
    counted = _SKIPPED.search(last)
    reasons = [m[1].strip() for m in map(_SKIP.match, lines) if m]
    return TestRun(
        rc=rc,
        last=last,
        skipped=int(counted[1]) if counted else 0,
        reasons=tuple(dict.fromkeys(reasons)),
        failures=tuple(line for line in lines if line.startswith(("FAILED ", "ERROR "))),
    )


def run_tests(tree: Path, tests: tuple[str, ...]) -> TestRun:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-rfEs", "-p", "no:cacheprovider", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return read_run(done.returncode, done.stdout, done.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", type=Path, default=PLANTS)
    parser.add_argument(
        "--changed",
        action="store_true",
        help="only the plants whose file or tests changed since the merge base (or are new)",
    )
    parser.add_argument(
        "--base", metavar="REF", help="with --changed: measure from the merge base with REF"
    )
    parser.add_argument("names", nargs="*", help="run only these plants")
    args = parser.parse_args(argv)
    if args.base is not None and not args.changed:
        parser.error("--base goes with --changed")
    plants = load_plants(args.plants)
    if args.names:
        missing = set(args.names) - {p.name for p in plants}
        if missing:
            raise SystemExit(f"no plant named {sorted(missing)}")
        plants = [p for p in plants if p.name in args.names]
    if args.changed:
        base, what = merge_base(args.base)
        chosen = touched_plants(plants, changed_since(base), plants_at(base, args.plants))
        print(f"--changed: {len(chosen)} of {len(plants)} plants, from {base[:12]} ({what})")
        plants = chosen
        if not plants:
            return 0
    survived: list[str] = []
    broken: list[str] = []
    not_run: list[str] = []
    with tempfile.TemporaryDirectory(prefix="envbuilder-mutants.") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        every_test = tuple(dict.fromkeys(t for p in plants for t in p.tests))
        baseline = run_tests(tree, every_test)
        print(
            f"baseline: {len(every_test)} test paths on the unchanged tree: {baseline.last}",
            flush=True,
        )
        if baseline.rc != 0:
            for line in baseline.failures:
                print(f"  {line}", file=sys.stderr)
            print("the tests fail without any plant; fix them first", file=sys.stderr)
            return 2
        for plant in plants:
            target = tree / plant.file
            original = target.read_text(encoding="utf-8")
            count = original.count(plant.find)
            if count != 1:
                broken.append(plant.name)
                print(f"✕ {plant.name}: its text occurs {count} times in {plant.file}", flush=True)
                continue
            target.write_text(original.replace(plant.find, plant.replace), encoding="utf-8")
            started = time.monotonic()
            try:
                outcome = run_tests(tree, plant.tests)
            finally:
                target.write_text(original, encoding="utf-8")
            took = time.monotonic() - started
            if outcome.rc == 1:
                print(f"✓ killed   {plant.name} ({took:.1f}s): {outcome.last}", flush=True)
            elif outcome.rc == 0 and outcome.skipped:
                not_run.append(plant.name)
                why = "; ".join(outcome.reasons) or "reason not given"
                print(f"- not run here {plant.name}: {outcome.skipped} skipped ({why})", flush=True)
            elif outcome.rc == 0:
                survived.append(plant.name)
                print(f"✕ SURVIVED {plant.name} ({took:.1f}s): {plant.why}", flush=True)
            else:
                broken.append(plant.name)
                print(
                    f"✕ broken   {plant.name}: pytest exit {outcome.rc}: {outcome.last}",
                    flush=True,
                )
    killed = len(plants) - len(survived) - len(broken) - len(not_run)
    print(
        f"{killed} of {len(plants)} planted bugs killed, {len(survived)} survived, "
        f"{len(broken)} broken, {len(not_run)} not run here"
    )
    return 0 if not survived and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
