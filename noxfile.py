"""Sessions for envbuilder. `nox -l` lists them; expensive ones are not default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.10.9"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

# Sessions run on the interpreter nox runs on (any python3 from 3.11 up), so the README's
# first command works wherever its `python3` does; an interpreter named but absent fails
# loudly rather than being skipped.
PYTHON = None
MIN_PYTHON = (3, 11)
nox.options.error_on_missing_interpreters = True


def _install_project(session: nox.Session, *groups: str) -> None:
    if sys.version_info < MIN_PYTHON:
        session.error(
            f"envbuilder needs Python >= 3.11; nox runs on {sys.version.split()[0]}. "
            "Install nox with a newer interpreter, e.g. `python3.12 -m pip install nox`, "
            "or run `pipx run --python python3.12 nox ...`."
        )
    args = ["-e", ".[all]"]  # the pipeline needs every extra (envbuilder/extras.py)
    for group in groups:
        args += ["--group", group]
    session.install("--upgrade", "pip>=25.1")
    session.install(*args)


@nox.session(python=PYTHON, tags=["pipeline"])
def resolve(session: nox.Session) -> None:
    """Resolve matrix.toml into hash-pinned locks: nox -s resolve -- [SELECTOR...]."""
    _install_project(session)
    session.run("envbuilder", "resolve", *session.posargs)


@nox.session(python=PYTHON, tags=["pipeline"])
def build(session: nox.Session) -> None:
    """One Docker image per resolved combination, from its lock: nox -s build -- SELECTOR [--force] [--push REGISTRY]."""
    if not session.posargs:
        session.error("Usage: nox -s build -- SELECTOR [SELECTOR...] [--force] [--push REGISTRY]")
    _install_project(session)
    session.run("envbuilder", "build", *session.posargs)


@nox.session(python=PYTHON, tags=["pipeline"])
def matrix(session: nox.Session) -> None:
    """GitHub Actions job matrix of resolvable combinations: nox -s matrix -- [SELECTOR...] [--format github|json|ids]."""
    _install_project(session)
    # Only resolved combinations get jobs, so the matrix needs the resolution; make it when absent.
    if not Path("locks/resolution.json").is_file():
        session.log("locks/resolution.json is absent: resolving the whole matrix first")
        session.run("envbuilder", "resolve")
    session.run("envbuilder", "matrix", "--resolution", "locks/resolution.json", *session.posargs)


#: `envbuilder conformance` options that take a value (the others are flags).
_CONFORMANCE_VALUE_OPTIONS = ("--out-dir", "--checks", "--locks", "--matrix", "--image-records")


def _selectors_and_locks(posargs: list[str]) -> tuple[list[str], Path]:
    """The SELECTORs among `envbuilder conformance` arguments, and its --locks directory."""
    selectors: list[str] = []
    locks = Path("locks")
    args = iter(posargs)
    for arg in args:
        name, has_value, value = arg.partition("=")
        if name in _CONFORMANCE_VALUE_OPTIONS:
            value = value if has_value else next(args, "")
            if name == "--locks":
                locks = Path(value)
        elif not arg.startswith("-"):
            selectors.append(arg)
    return selectors, locks


@nox.session(python=PYTHON, default=False, tags=["pipeline"])
def conformance(session: nox.Session) -> None:
    """Run the conformance suite: nox -s conformance -- SELECTOR [--in-place] [--quick] (results/<id>.json)."""
    selectors, locks = _selectors_and_locks(session.posargs)
    if not selectors:
        session.error("Usage: nox -s conformance -- SELECTOR [SELECTOR...] [--in-place] [--quick]")
    _install_project(session)
    if "--in-place" in session.posargs:
        # In place, the suite measures this session's environment: it gets the combination's
        # lock, installed exactly (hashes, no dependencies of its own), over the project.
        requirements = locks / f"requirements.{selectors[0]}.txt"
        if len(selectors) != 1 or not requirements.is_file():
            session.error(
                f"--in-place installs one combination's lock ({requirements}): name one resolved"
                " combination id, after `nox -s resolve` (or with the locks downloaded)"
            )
        session.install("--require-hashes", "--no-deps", "-r", str(requirements))
        # Then the suite's own dependencies (diffusers for the model checks), locked beside it.
        suite = locks / f"requirements.{selectors[0]}.suite.txt"
        if suite.is_file():
            session.install("--require-hashes", "--no-deps", "-r", str(suite))
        else:
            session.warn(f"no {suite} (matrix.toml has no [suite]): the model checks will skip")
        if _is_source_build(locks, selectors[0]):
            # xformers is not in the lock: it is built from its locked sdist against the torch
            # just installed (a cache hit when built before), and that very wheel installed.
            session.run(
                "envbuilder", "build-wheel", selectors[0], "--in-place", "--locks", str(locks),
                "--assets", str(BUILT_WHEELS),
            )  # fmt: skip
            session.install(
                "--no-deps", "--no-index", str(_built_wheel(session, locks, selectors[0]))
            )
    session.run("envbuilder", "conformance", *session.posargs)


#: where `build_wheel` (and an in-place `conformance` of a source build) leaves the built wheels
#: and their build records under the names the GPU matrix run publishes them by
BUILT_WHEELS = Path("built-wheels")


def _is_source_build(locks: Path, combination: str) -> bool:
    """Whether resolution.json says the combination's xformers is built from its sdist."""
    import json

    try:
        data = json.loads((locks / "resolution.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return any(
        c.get("id") == combination and c.get("source_build") for c in data.get("combinations", [])
    )


def _built_wheel(session: nox.Session, locks: Path, combination: str) -> Path:
    """The wheel that build-wheel just put into BUILT_WHEELS, under its own file name and
    checked against its build record (the asset's name is ``<id>.<wheel file name>``)."""
    import hashlib
    import json
    import re
    import shutil

    record = json.loads((locks / f"build-record.{combination}.json").read_text(encoding="utf-8"))
    filename, sha256 = str(record["wheel"]["filename"]), str(record["wheel"]["sha256"])
    asset = BUILT_WHEELS / re.sub(r"[^A-Za-z0-9._-]", "_", f"{combination}.{filename}")
    wheel = Path(session.create_tmp()) / filename
    shutil.copyfile(asset, wheel)
    if hashlib.sha256(wheel.read_bytes()).hexdigest() != sha256:
        session.error(f"{asset} is not the wheel its build record names (sha256 {sha256})")
    return wheel


@nox.session(python=PYTHON, default=False, tags=["pipeline"])
def build_wheel(session: nox.Session) -> None:
    """Build a source-build row's xformers from its locked sdist: nox -s build_wheel -- ID [--in-place] (built-wheels/)."""
    selectors = [a for a in session.posargs if not a.startswith("-")]
    if len(selectors) != 1:
        session.error("Usage: nox -s build_wheel -- ID [--in-place] [--force] (one combination id)")
    _install_project(session)
    session.run("envbuilder", "build-wheel", *session.posargs, "--assets", str(BUILT_WHEELS))


@nox.session(python=PYTHON, tags=["pipeline"])
def lock(session: nox.Session) -> None:
    """Merge locks/ and results/ into compat.lock.json: nox -s lock -- [envbuilder lock OPTIONS]."""
    _install_project(session)
    session.run("envbuilder", "lock", *session.posargs)


@nox.session(python=PYTHON, tags=["pipeline"])
def publish(session: nox.Session) -> None:
    """Write the static site (site/) from compat.lock.json: nox -s publish -- [envbuilder publish OPTIONS]."""
    _install_project(session)
    session.run("envbuilder", "publish", *session.posargs)


@nox.session(python=PYTHON, default=False, tags=["pipeline"])
def snapshot(session: nox.Session) -> None:
    """Write the lockfile snapshot the wheel carries (envbuilder/data/): nox -s snapshot -- LOCKFILE|URL."""
    if not session.posargs:
        session.error(
            "Usage: nox -s snapshot -- LOCKFILE|URL [--with-locks] [--allow-host HOST]"
            " (the published lockfile, e.g. site/compat.lock.json)"
        )
    _install_project(session)
    session.run("envbuilder", "snapshot", *session.posargs)


#: actionlint, pinned by sha256 (its package wraps a fork's build: docs/github-actions.md)
ACTIONLINT_REQUIREMENTS = "requirements/actionlint.txt"


def _install_actionlint(session: nox.Session) -> None:
    """actionlint for the lint gate and the workflow tests, only as its hashes pin it."""
    pinned = ("--require-hashes", "--no-deps", "--only-binary", ":all:")
    session.install(*pinned, "-r", ACTIONLINT_REQUIREMENTS)


@nox.session(python=PYTHON, tags=["check"])
def lint(session: nox.Session) -> None:
    """Run ruff over the package, tests and noxfile, and actionlint over the workflows."""
    _install_project(session, "lint")
    _install_actionlint(session)
    session.run("ruff", "check", "envbuilder", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "envbuilder", "tests", "noxfile.py")
    session.run("actionlint")


@nox.session(python=PYTHON, tags=["check"])
def typecheck(session: nox.Session) -> None:
    """Run mypy --strict over the package, tests and noxfile."""
    _install_project(session, "lint", "test")
    session.run("mypy", *session.posargs)


def _install_tests(session: nox.Session, *groups: str) -> None:
    """The project with the test group and torch 2.13.0 (the conformance suite's CPU checks);
    pip's configuration decides where torch comes from, or ENVBUILDER_TORCH_INDEX_URL (e.g. a
    CPU-only index) when set. ``groups``: more dependency groups, installed with torch so
    that one resolution keeps that torch."""
    _install_project(session, "test")
    _install_actionlint(session)  # the workflow tests run it
    torch_index = os.environ.get("ENVBUILDER_TORCH_INDEX_URL")
    extra = ["--extra-index-url", torch_index] if torch_index else []
    session.install("torch==2.13.0", *(a for g in groups for a in ("--group", g)), *extra)


def _pytest(session: nox.Session, *args: str, paths: tuple[str, ...]) -> None:
    """pytest with ``args`` over ``paths``; test paths among the posargs replace ``paths``,
    other posargs (``-k``, ``-x``, ``-m``, ``-n 0``) come last and so win."""
    named = any(Path(a.split("::")[0]).exists() for a in session.posargs if not a.startswith("-"))
    session.run("pytest", *args, *(() if named else paths), *session.posargs)


#: what `tests` runs: the pure and the loopback tests; the rest have sessions of their own
FAST_TESTS = ("tests/unit", "tests/integration")
REHEARSAL = "tests/docker/test_runner_rehearsal.py"


@nox.session(python=PYTHON, tags=["check", "tests"])
def tests(session: nox.Session) -> None:
    """Unit and integration tests in parallel, not `slow`: nox -s tests -- [PYTEST ARGS]."""
    # diffusers and xformers: the masks and model checks run on CPU here
    _install_tests(session, "suite", "xformers")
    _pytest(session, "-n", "auto", "--dist", "loadfile", "-m", "not slow", paths=FAST_TESTS)


@nox.session(python=PYTHON, default=False, tags=["tests"])
def tests_slow(session: nox.Session) -> None:
    """The `slow` unit and integration tests that `tests` leaves out: nox -s tests_slow."""
    # no xformers: the workflow rehearsal runs the suite in place for a combination without
    # one, which this environment must then be
    _install_tests(session, "suite")
    _pytest(session, "-m", "slow", paths=FAST_TESTS)


@nox.session(python=PYTHON, default=False, tags=["tests"])
def tests_network(session: nox.Session) -> None:
    """Tests against the real public package index (tests/network): nox -s tests_network."""
    _install_tests(session)
    _pytest(session, paths=("tests/network",))


@nox.session(python=PYTHON, default=False, tags=["tests"])
def tests_docker(session: nox.Session) -> None:
    """Tests against a real Docker daemon (`bash .ci/setup` starts one): nox -s tests_docker."""
    _install_tests(session)
    _pytest(session, f"--ignore={REHEARSAL}", paths=("tests/docker",))


@nox.session(python=PYTHON, default=False, tags=["tests"])
def rehearsal(session: nox.Session) -> None:
    """Rehearse the GPU workflow in a runner-like container (needs Docker): nox -s rehearsal."""
    _install_tests(session)
    _pytest(session, paths=(REHEARSAL,))


@nox.session(python=PYTHON, default=False, tags=["tests"])
def tests_browser(session: nox.Session) -> None:
    """The published site in headless Chromium (tests/browser): nox -s tests_browser."""
    _install_tests(session)
    _pytest(session, paths=("tests/browser",))


@nox.session(python=PYTHON, default=False, tags=["tests"])
def tests_gpu(session: nox.Session) -> None:
    """The suite on a real CUDA GPU (tests/gpu; skips without one): nox -s tests_gpu."""
    _install_tests(session, "suite", "xformers")
    _pytest(session, paths=("tests/gpu",))


@nox.session(python=PYTHON, tags=["check"])
def mutants(session: nox.Session) -> None:
    """Plant each bug of tests/mutation/plants.toml and fail if its tests miss one: nox -s mutants -- [--changed] [NAME...]."""
    _install_project(session, "test")
    session.run("python", "tests/mutation/run.py", *session.posargs)


@nox.session(python=PYTHON, default=False, tags=["bench"])
def bench(session: nox.Session) -> None:
    """Benchmarks against anchors: nox -s bench -- resolve|build|doctor|source-build|suite [ARGS]."""
    if not session.posargs:
        session.error("Usage: nox -s bench -- resolve|build|doctor|source-build|suite [ARGS...]")
    _install_project(session)
    if session.posargs[0] == "doctor":
        # doctor's file check is measured over an environment of realistic size: torch's.
        session.install("torch==2.13.0")
    session.run("python", "-m", "envbuilder.bench", *session.posargs)
