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

Everything is verified before anything touches the disk: the lockfile, the
entry and its verdict, the export of its lock (present, its sha256 as
recorded), and the interpreter — for ``--venv``, a Python of the entry's
version that uv can find and a directory that is absent or already a venv;
for ``--python-exe``, its version (and pip, with ``--installer pip``). A
missing Python or pip is named with how to provide it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from envbuilder.lockfile.model import INSTALLABLE

__all__ = ["install"]


def _interpreter_version(exe: Path) -> str:
    from envbuilder.errors import InputError

    try:
        out = subprocess.run(
            [str(exe), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        raise InputError(f"--python-exe {str(exe)!r} is not a working Python ({e})") from e
    return out.stdout.strip()


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
        f"and run this again, or pass --python-exe PATH of an existing Python {python}"
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
    python_exe: Path, entry_python: str, combination: str, installer: str
) -> None:
    """``python_exe`` is the entry's Python and, for pip, has pip."""
    from envbuilder.errors import InputError, MissingToolError

    have = _interpreter_version(python_exe)
    if have != entry_python:
        raise InputError(
            f"{python_exe} is Python {have}, but {combination!r} needs Python {entry_python}; "
            + _how_to_get(entry_python)
        )
    if installer == "pip":
        pip = subprocess.run(
            [str(python_exe), "-m", "pip", "--version"], capture_output=True, text=True
        )
        if pip.returncode != 0:
            raise MissingToolError(
                f"pip is not installed in {python_exe} (Python {have}); run "
                f"`{python_exe} -m ensurepip`, or pass --installer uv"
            )


def _check_venv_directory(venv: Path) -> None:
    """A venv to create goes into an absent or empty directory, never over other files."""
    from envbuilder.errors import InputError

    if venv.exists() and (not venv.is_dir() or any(venv.iterdir())):
        raise InputError(
            f"--venv {venv} exists and is not a virtual environment (it has no bin/python); "
            "choose a new directory, or remove it first"
        )


def install(args: argparse.Namespace) -> int:
    """Choose the combination, refuse an unverified one, install its lock with uv or pip."""
    from envbuilder.errors import EnvbuilderError, InputError
    from envbuilder.lockfile.export import exported
    from envbuilder.lockfile.model import use_verdict
    from envbuilder.lockfile.published import lockfile_argument
    from envbuilder.lockfile.query import Query, replacement, select
    from envbuilder.lockfile.read import load_lockfile
    from envbuilder.reporter import Reporter

    report = Reporter(verbose=args.verbose)
    lockfile = lockfile_argument(args.lock, args.settings, with_locks=True)
    lock = load_lockfile(lockfile)
    python_exe: Path = args.python_exe or Path(sys.executable)
    if args.venv is not None:
        python_exe = args.venv / "bin" / "python"

    if args.id:
        entry = lock.by_id().get(args.id)
        if entry is None:
            raise InputError(f"no combination {args.id!r} in {lockfile}; see `envbuilder query`")
        verdict = entry.verdict if args.use is None else use_verdict(entry.uses, args.use)
    else:
        python = args.python
        if python is None and python_exe.exists():
            python = _interpreter_version(python_exe)
        matches = select(
            lock,
            Query(
                python=python,
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
    use = f" for {args.use}" if args.use else ""
    report.line(f"combination {entry.id}{use}: {verdict.verdict} ({verdict.reason})")
    if verdict.verdict not in INSTALLABLE and not args.allow_unverified:
        alternative = (
            replacement(lock, entry, args.use) if verdict.verdict == "xformers-unusable" else None
        )
        instead = (
            f"; without xformers {alternative.id!r} is {alternative.verdict.verdict}{use}: "
            f"`envbuilder install {alternative.id}`"
            if alternative is not None
            else ""
        )
        raise InputError(
            f"refusing to install {entry.id!r}: it is {verdict.verdict}{use}, not verified"
            f"{instead}; pass --allow-unverified to install it anyway"
        )
    for choice in verdict.choices:
        report.line(
            f"! {choice.check} is verified{use} only with the workaround "
            f"{choice.workaround!r} (measured on its case by {', '.join(choice.evidence)}): "
            "apply it in your code"
        )
    chosen = {c.workaround for c in verdict.choices}
    for workaround in verdict.workarounds:
        if not workaround.startswith("cuda-runtime:") and workaround not in chosen:
            report.line(
                f"! verified only with the workaround {workaround!r}: apply it in your code"
            )

    fmt = "pylock" if args.installer == "uv" else "requirements"
    # the lock is verified before the disk is touched
    data = exported(lockfile, entry.id, fmt, with_suite=args.with_suite)
    create_venv = args.venv is not None and not python_exe.exists()
    base = entry.python
    if create_venv:
        _check_venv_directory(args.venv)
        if not args.dry_run:
            base = _find_python(entry.python, entry.id)
    elif not args.dry_run:
        _check_interpreter(python_exe, entry.python, entry.id, args.installer)

    if create_venv:
        cmd = [_uv(), "venv", "--python", base, str(args.venv)]
        if args.installer == "pip":
            cmd.insert(2, "--seed")  # the venv needs pip itself
        report.command(cmd)
        if not args.dry_run:
            env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
            made = subprocess.run(cmd, check=False, env=env)
            if made.returncode != 0:
                raise EnvbuilderError(
                    f"uv could not create the venv {args.venv} from {base} "
                    f"(exit status {made.returncode}; its message is above)"
                )
            _check_interpreter(python_exe, entry.python, entry.id, args.installer)
    with tempfile.TemporaryDirectory(prefix="envbuilder-install-") as tmp:
        if fmt == "pylock":
            file = Path(tmp) / "pylock.toml"
            cmd = [_uv(), "pip", "install", "--python", str(python_exe), "--no-build"]
            cmd += ["-r", str(file)]
        else:
            file = Path(tmp) / "requirements.txt"
            cmd = [str(python_exe), "-m", "pip", "install", "--require-hashes", "--no-deps"]
            cmd += ["--only-binary", ":all:", "-r", str(file)]
        file.write_bytes(data)
        report.command(cmd)
        if args.dry_run:
            return 0
        result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        report.line(f"✕ installing {entry.id} failed (exit status {result.returncode})")
        return 1
    report.line(f"✓ installed {entry.id} into {python_exe}")
    if entry.extra_runtime:
        from envbuilder.docker.plan import library_path

        prefix = subprocess.run(
            [str(python_exe), "-c", "import sys; print(sys.prefix)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        path = library_path(entry.extra_runtime, python=entry.python, venv=prefix)
        if path:
            report.line(
                f"! {entry.id} adds a CUDA runtime for xformers' extension: before running, "
                f"export LD_LIBRARY_PATH={path}"
            )
    return 0
