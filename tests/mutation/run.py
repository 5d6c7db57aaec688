"""Plant each bug of ``plants.toml`` in a copy of the tree and run the tests meant to catch it.

A plant is one exact edit to one file: the text it replaces must occur there
exactly once, so a plant that no longer applies fails loudly instead of being
skipped. Every plant must be *killed*: its tests fail with the bug in place. A
plant that survives is a check that cannot fail, and this command exits 1.
Before any plant, the same tests run on the unchanged copy and must pass, so a
kill is the bug's doing. The checkout itself is never modified.

    python tests/mutation/run.py [--plants FILE] [NAME ...]
"""

from __future__ import annotations

import argparse
import os
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


@dataclass(frozen=True, kw_only=True)
class Plant:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


def load_plants(path: Path) -> list[Plant]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
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


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else done.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", type=Path, default=PLANTS)
    parser.add_argument("names", nargs="*", help="run only these plants")
    args = parser.parse_args(argv)
    plants = load_plants(args.plants)
    if args.names:
        missing = set(args.names) - {p.name for p in plants}
        if missing:
            raise SystemExit(f"no plant named {sorted(missing)}")
        plants = [p for p in plants if p.name in args.names]
    survived: list[str] = []
    broken: list[str] = []
    with tempfile.TemporaryDirectory(prefix="envbuilder-mutants.") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        every_test = tuple(dict.fromkeys(t for p in plants for t in p.tests))
        rc, last = run_tests(tree, every_test)
        print(f"baseline: {len(every_test)} test paths on the unchanged tree: {last}", flush=True)
        if rc != 0:
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
                rc, last = run_tests(tree, plant.tests)
            finally:
                target.write_text(original, encoding="utf-8")
            took = time.monotonic() - started
            if rc == 1:
                print(f"✓ killed   {plant.name} ({took:.1f}s): {last}", flush=True)
            elif rc == 0:
                survived.append(plant.name)
                print(f"✕ SURVIVED {plant.name} ({took:.1f}s): {plant.why}", flush=True)
            else:
                broken.append(plant.name)
                print(f"✕ broken   {plant.name}: pytest exit {rc}: {last}", flush=True)
    killed = len(plants) - len(survived) - len(broken)
    print(
        f"{killed} of {len(plants)} planted bugs killed, {len(survived)} survived, "
        f"{len(broken)} broken"
    )
    return 0 if not survived and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
