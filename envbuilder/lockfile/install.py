"""Installing one combination of the lockfile, exactly as locked (``envbuilder install``).

Only ``verified`` and ``verified-with-workaround`` combinations are installed
(the workaround is printed: a code-level one such as ``dynamo-disable`` is
the user's to apply); anything else needs ``--allow-unverified``. An
``xformers-unusable`` one is refused naming the combination without xformers
when that one is verified for the use. With
``--use`` the verdict for that use decides (eager or compiled, inference or
training), and the workarounds printed are those verified for that use. The lock is
exported (`envbuilder.lockfile.export.exported`) and handed to uv (a pylock)
or pip (a ``--require-hashes`` requirements file) for the target interpreter.

The interpreter is the user's (`envbuilder.lockfile.interpreter`): ``--python``
(a version or a path), else the active venv, else the active conda env, else
the first ``python3`` on PATH; the first line of output names it. ``--venv DIR``
installs into that venv, created when absent from ``--python`` (a base
interpreter, or a version uv finds; default: the entry's version).

Everything is verified before anything touches the disk: the lockfile, the
entry and its verdict, the export of its lock (present, its sha256 as
recorded), and the interpreter — its version, pip with ``--installer pip``;
for a ``--venv`` to create, a directory that is absent or empty and a base
Python of the entry's version. A missing Python or pip is named with how to
provide it. ``--dry-run`` makes the same checks and prints the commands the
real run would run, the exported lock kept at a printed path, so that they can
be pasted. A combination whose xformers is built from source also needs the
wheel its build record pins (`sourcebuilds`), installed after the lock's files: from
``--wheel``, the build cache, else published beside a lockfile URL (`lockfile.published_wheel`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envbuilder.lockfile.interpreter import Interpreter
from envbuilder.lockfile.model import INSTALLABLE, CompatLock, Entry, Use, Verdict
from envbuilder.lockfile.runtime_path import announce
from envbuilder.reporter import Reporter
from envbuilder.settings import Settings
from envbuilder.target import library_path

__all__ = ["InstallRequest", "install"]


@dataclass(frozen=True, kw_only=True)
class InstallRequest:
    """What ``envbuilder install`` was asked: the combination (an id, or what to choose it
    by), where to install it, with which installer, and what may be installed."""

    settings: Settings
    lock: str | None = None  # the lockfile: a path or URL; None: the default choice
    id: str | None = None
    python: str | None = None  # a version or an interpreter (path, venv, name on PATH)
    venv: Path | None = None
    cuda: str | None = None
    torch: str | None = None
    xformers: str | None = None
    gpu: str | None = None
    use: Use | None = None
    allow_unverified: bool = False
    installer: Literal["uv", "pip"] = "uv"
    with_suite: bool = False
    dry_run: bool = False
    wheel: Path | None = None  # a source build's wheel
    build_cache: Path | None = None


def _uv() -> str:
    """uv from the ``install`` extra, else on PATH; neither names the extra and --installer pip."""
    import shutil

    from envbuilder.errors import MissingToolError
    from envbuilder.extras import missing

    try:
        from uv import find_uv_bin

        return os.fsdecode(find_uv_bin())
    except (ImportError, FileNotFoundError) as e:
        found = shutil.which("uv")
        if found:
            return found
        gap = missing("uv", extra="install", needed_for="envbuilder install (uv is its default)")
        raise MissingToolError(f"{gap}; or put uv on PATH, or pass --installer pip") from e


def _how_to_get(python: str) -> str:
    return (
        f"install Python {python} (`uv python install {python}`, or your system's packages) "
        f"and run this again, or pass --python PATH of an existing Python {python}"
    )


def _find_python(python: str, combination: str) -> str:
    """The interpreter of version ``python`` uv makes a venv from; none is a clear error."""
    from envbuilder.errors import MissingToolError

    found = subprocess.run(
        [_uv(), "python", "find", python],
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    if found.returncode != 0 or not found.stdout.strip():
        said = next((line for line in found.stderr.splitlines() if line.strip()), "no output")
        raise MissingToolError(
            f"{combination!r} needs Python {python}, and uv finds none ({said.strip()}); "
            + _how_to_get(python)
        )
    return found.stdout.strip().splitlines()[0]


def _check_interpreter(
    chosen: Interpreter, entry_python: str, combination: str, installer: str, *, base: bool = False
) -> None:
    """The chosen interpreter is the entry's Python and, for pip, has pip."""
    from envbuilder.errors import InputError, MissingToolError

    if chosen.version != entry_python:
        raise InputError(
            f"{chosen.executable} is Python {chosen.version}, but {combination!r} needs Python "
            f"{entry_python}; "
            + _how_to_get(entry_python)
            + ("" if base else f", or create a venv for it: --venv DIR --python {entry_python}")
        )
    if installer == "pip":
        from envbuilder.lockfile.interpreter import has_pip

        if not has_pip(chosen.executable):
            raise MissingToolError(
                f"pip is not installed in {chosen.executable} (Python {chosen.version}); run "
                f"`{chosen.executable} -m ensurepip`, or pass --installer uv"
            )


def _check_venv_directory(venv: Path) -> None:
    """A venv to create goes into an absent or empty directory, never over other files."""
    from envbuilder.errors import InputError

    if venv.exists() and (not venv.is_dir() or any(venv.iterdir())):
        raise InputError(
            f"--venv {venv} exists and is not a virtual environment (it has no bin/python); "
            "choose a new directory, or remove it first"
        )


def _target(
    args: InstallRequest,
) -> tuple[Interpreter | None, Interpreter | None, str | None]:
    """(the interpreter to install into, when it exists; the base to create ``--venv``
    from, when ``--python`` names one as a path; the version ``--python`` names). The first
    two None: ``--venv`` is created from a Python of the entry's version, or of
    ``--python VERSION``."""
    from envbuilder.errors import InputError
    from envbuilder.lockfile.interpreter import choose, interpreter_version, parse_python

    request = parse_python(args.python) if args.python else None
    wanted = request.version if request is not None else None
    if args.venv is None:
        return choose(request), None, wanted
    python = args.venv / "bin" / "python"
    if python.exists():
        if request is not None:
            raise InputError(
                f"--venv {args.venv} is already a virtual environment: --python names the "
                "interpreter to create a new one from; leave --python out to install into "
                "it, or choose a new directory"
            )
        version = interpreter_version(python, option="--venv")
        return Interpreter(executable=python, version=version, source="--venv"), None, None
    _check_venv_directory(args.venv)
    if request is not None and request.path is not None:
        return None, choose(request), None
    return None, None, wanted


def _kept(settings: Settings, combination: str, fmt: str) -> Path:
    """Where the exported lock stays, so that the printed command can be pasted."""
    name = "pylock.toml" if fmt == "pylock" else "requirements.txt"
    return settings.cache_dir / "install" / combination / name


def _refuse(
    lock: CompatLock, entry: Entry, verdict: Verdict, use: Use | None, allowed: bool
) -> None:
    """Refuse a combination that is not verified (for *use*) unless *allowed*."""
    from envbuilder.errors import InputError
    from envbuilder.lockfile.query import replacement

    if verdict.verdict in INSTALLABLE or allowed:
        return
    alternative = replacement(lock, entry, use) if verdict.verdict == "xformers-unusable" else None
    said = f" for {use}" if use else ""
    instead = (
        f"; without xformers {alternative.id!r} is {alternative.verdict.verdict}{said}: "
        f"`envbuilder install {alternative.id}`"
        if alternative is not None
        else ""
    )
    raise InputError(
        f"refusing to install {entry.id!r}: it is {verdict.verdict}{said}, not verified"
        f"{instead}; pass --allow-unverified to install it anyway"
    )


def install(args: InstallRequest, report: Reporter) -> int:
    """Choose the interpreter and the combination, refuse an unverified one, install its lock
    with uv or pip. ``--dry-run`` makes every check the real run makes and prints the commands
    it would run; it only writes the exported lock, at the printed path."""
    from envbuilder.errors import EnvbuilderError, InputError
    from envbuilder.files import write_atomic
    from envbuilder.lockfile.export import exported_entry
    from envbuilder.lockfile.model import use_verdict
    from envbuilder.lockfile.published import lockfile_choice
    from envbuilder.lockfile.query import Query, select
    from envbuilder.lockfile.read import load_lockfile

    lockfile, source = lockfile_choice(args.lock, args.settings, with_locks=True)
    if source:
        report.line(source)
    lock = load_lockfile(lockfile)
    use = f" for {args.use}" if args.use else ""

    if args.id:
        entry = lock.by_id().get(args.id)
        if entry is None:
            raise InputError(f"no combination {args.id!r} in {lockfile}; see `envbuilder query`")
        verdict = entry.verdict if args.use is None else use_verdict(entry.uses, args.use)
        try:  # the combination decides before the interpreter is asked anything
            _refuse(lock, entry, verdict, args.use, args.allow_unverified)
        except InputError:
            report.line(f"combination {entry.id}{use}: {verdict.verdict} ({verdict.reason})")
            raise
        chosen, base, wanted = _target(args)
    else:
        chosen, base, wanted = _target(args)
        known = chosen or base
        matches = select(
            lock,
            Query(
                python=known.version if known is not None else wanted,
                cuda=args.cuda,
                torch=args.torch,
                xformers=args.xformers,
                gpu=args.gpu,
                use=args.use,
            ),
        )
        if not matches:
            raise InputError(f"no combination in {lockfile} matches; see `envbuilder query`")
        entry, verdict = matches[0].entry, matches[0].verdict
    if chosen is not None:
        report.line(f"interpreter: {chosen.describe()}")
    elif base is not None:
        report.line(f"interpreter: a new venv {args.venv}, from {base.describe()}")
    else:
        report.line(
            f"interpreter: a new venv {args.venv}, from the Python {wanted or entry.python} "
            "that `uv python find` names"
        )
    report.line(f"combination {entry.id}{use}: {verdict.verdict} ({verdict.reason})")
    _refuse(lock, entry, verdict, args.use, args.allow_unverified)
    for choice in verdict.choices:
        report.line(
            f"! {choice.check} is verified{use} only with the workaround "
            f"{choice.workaround!r} (measured on its case by {', '.join(choice.evidence)}): "
            "apply it in your code"
        )
    chosen_workarounds = {c.workaround for c in verdict.choices}
    for workaround in verdict.workarounds:
        if not workaround.startswith("cuda-runtime:") and workaround not in chosen_workarounds:
            report.line(
                f"! verified only with the workaround {workaround!r}: apply it in your code"
            )

    from envbuilder.lockfile.published_wheel import lockfile_url, wheel_for_install
    from envbuilder.lockfile.sourcebuilds import staged_wheel
    from envbuilder.lockfile.sourcebuilds import wheel_install_command as built_command

    cache = args.build_cache or args.settings.cache_dir / "source-builds"
    built, fetched = wheel_for_install(
        entry, wheel=args.wheel, build_cache=cache,
        lock_url=lockfile_url(args.lock, args.settings), settings=args.settings,
    )  # fmt: skip
    if fetched:
        report.line(fetched)
    fmt = "pylock" if args.installer == "uv" else "requirements"
    # the lock and the interpreter are verified before the disk is touched, dry run or not
    data = exported_entry(lockfile, entry, fmt, with_suite=args.with_suite)
    if chosen is not None:
        _check_interpreter(chosen, entry.python, entry.id, args.installer)
        python_exe = chosen.executable
    else:
        if base is None:
            version = wanted or entry.python
            found = Path(_find_python(version, entry.id))
            base = Interpreter(
                executable=found, version=version, source=f"uv python find {version}"
            )
        _check_interpreter(base, entry.python, entry.id, "uv", base=True)  # --seed: pip
        assert args.venv is not None  # `_target` chooses no interpreter only for a new venv
        python_exe = args.venv / "bin" / "python"
        cmd = [_uv(), "venv", "--python", str(base.executable), str(args.venv)]
        if args.installer == "pip":
            cmd.insert(2, "--seed")  # the venv needs pip itself
        report.command(cmd)
        if not args.dry_run:
            env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
            made = subprocess.run(cmd, check=False, env=env)
            if made.returncode != 0:
                raise EnvbuilderError(
                    f"uv could not create the venv {args.venv} from {base.executable} "
                    f"(exit status {made.returncode}; its message is above)"
                )
            created = Interpreter(executable=python_exe, version=base.version, source="--venv")
            _check_interpreter(created, entry.python, entry.id, args.installer)

    file = _kept(args.settings, entry.id, fmt)
    write_atomic(file, data)
    report.line(f"lock: {file} ({fmt} of {entry.id}, from {lockfile})")
    if fmt == "pylock":
        cmd = [_uv(), "pip", "install", "--python", str(python_exe), "--no-build", "-r", str(file)]
    else:
        cmd = [str(python_exe), "-m", "pip", "install", "--require-hashes", "--no-deps"]
        cmd += ["--only-binary", ":all:", "-r", str(file)]
    report.command(cmd)
    then = None  # a source build's wheel goes in after the lock's files
    if built is not None:
        uv = _uv() if args.installer == "uv" else None
        staged = staged_wheel(entry, built, file.parent)
        then = built_command(staged, python_exe, args.installer, uv)
        report.command(then)
    runtime = runtime_line(entry, _prefix(python_exe, args.venv)) if entry.extra_runtime else None
    if args.dry_run:
        if runtime:
            report.line(announce(entry, _prefix(python_exe, args.venv), apply=False) or runtime)
        report.line("dry run: nothing installed; the commands above do it")
        return 0
    result = subprocess.run(cmd, check=False)
    if result.returncode == 0 and then is not None:
        result = subprocess.run(then, check=False)
    if result.returncode != 0:
        report.line(f"✕ installing {entry.id} failed (exit status {result.returncode})")
        return 1
    report.line(f"✓ installed {entry.id} into {python_exe}")
    if runtime:
        report.line(announce(entry, _prefix(python_exe, args.venv), apply=True) or runtime)
    return 0


def _prefix(python_exe: Path, venv: Path | None) -> str:
    """The environment's ``sys.prefix``: a venv's directory, else asked of the interpreter."""
    if venv is not None:
        return str(venv.absolute())
    if (python_exe.parent.parent / "pyvenv.cfg").is_file():
        return str(python_exe.parent.parent.absolute())
    return subprocess.run(
        [str(python_exe), "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def runtime_line(entry: Entry, prefix: str) -> str | None:
    """For a combination that adds a CUDA runtime (``-cudart``): the ``LD_LIBRARY_PATH`` its
    extension needs, prepended to what is there (never replacing it)."""
    if not entry.extra_runtime:
        return None
    path = library_path(entry.extra_runtime, python=entry.python, venv=prefix)
    if not path:
        return None
    return (
        f"! {entry.id} adds a CUDA runtime for xformers' extension: before running, "
        f'export LD_LIBRARY_PATH="{path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
        "(prepended; `envbuilder doctor` checks that the extension loads)"
    )
