"""Installing one combination of the lockfile, exactly as locked (``envbuilder install``).

Only ``verified`` and ``verified-with-workaround`` combinations are installed
(the workaround is printed: a code-level one such as ``dynamo-disable`` is
the user's to apply); anything else needs ``--allow-unverified``. An
``xformers-unusable`` one is refused naming the combination without xformers
when that one is verified for the use. With
``--use`` the verdict for that use decides (eager or compiled, inference or
training), and the workarounds printed are those verified for that use. The lock is
exported (`envbuilder.consumer.export.exported`) and handed to uv (a pylock)
or pip (a ``--require-hashes`` requirements file) for the target interpreter.

The interpreter is the user's (`envbuilder.consumer.interpreter`): ``--python``
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
``--wheel``, the build cache, else published beside a lockfile URL (`consumer.published_wheel`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envbuilder.consumer.interpreter import Interpreter
from envbuilder.consumer.runtime_path import announce
from envbuilder.credentials import redact_text
from envbuilder.lockfile.model import INSTALLABLE, CompatLock, Entry, Use, Verdict
from envbuilder.reporter import Reporter
from envbuilder.settings import Settings
from envbuilder.target import library_path

__all__ = ["InstallRequest", "index_options", "install"]


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
    #: None: uv where it is installed, else pip (`Installer`)
    installer: Literal["uv", "pip"] | None = None
    with_suite: bool = False
    dry_run: bool = False
    wheel: Path | None = None  # a source build's wheel
    build_cache: Path | None = None
    #: pip's configured ``--index-url``/``--extra-index-url`` options, passed on to uv (which
    #: does not read pip's configuration) where uv's own settings name no index
    pip_indexes: tuple[str, ...] = ()


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


def _installer(args: InstallRequest, report: Reporter) -> tuple[Literal["uv", "pip"], str | None]:
    """The installer, and the uv to run (None where it is missing): uv where
    it is installed, else pip with ``--require-hashes``, said once; a dry run never fails for
    a missing installer."""
    from envbuilder.errors import MissingToolError

    try:
        uv = _uv()
    except MissingToolError:
        if args.installer is None:
            report.line("uv is not installed here: installing with pip (--require-hashes)")
            return "pip", None
        if args.installer == "uv" and not args.dry_run:
            raise
        if args.installer == "uv":
            report.line("uv is not installed here: the commands below need it")
        return args.installer, None
    return args.installer or "uv", uv


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
        from envbuilder.consumer.interpreter import has_pip

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
            f"--venv {venv} exists and is not a virtual environment (it has no "
            f"{venv_python(Path()).as_posix()}); "
            "choose a new directory, or remove it first"
        )


def _target(
    args: InstallRequest,
) -> tuple[Interpreter | None, Interpreter | None, str | None]:
    """(the interpreter to install into, when it exists; the base to create ``--venv``
    from, when ``--python`` names one as a path; the version ``--python`` names). The first
    two None: ``--venv`` is created from a Python of the entry's version, or of
    ``--python VERSION``."""
    from envbuilder.consumer.interpreter import choose, interpreter_version, parse_python
    from envbuilder.errors import InputError

    request = parse_python(args.python) if args.python else None
    wanted = request.version if request is not None else None
    if args.venv is None:
        return choose(request), None, wanted
    python = venv_python(args.venv)
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


def _verified_instead(lock: CompatLock, entry: Entry, use: Use | None) -> str | None:
    """The row to install instead of the unverified *entry*, as `query` words it: without
    xformers where its xformers is unusable, else the same torch, xformers and CUDA on the
    nearest Python that is verified (for *use*)."""
    from envbuilder.consumer.query import Change, replacement, suggestion

    said = f" for {use}" if use else ""
    if entry.verdict.verdict == "xformers-unusable" or (
        use is not None and _verdict_for(entry, use).verdict == "xformers-unusable"
    ):
        alternative = replacement(lock, entry, use)
        if alternative is not None:
            return (
                f"without xformers {alternative.id!r} is {alternative.verdict.verdict}{said}: "
                f"`envbuilder install {alternative.id}`"
            )
    same = [
        e
        for e in lock.combinations
        if e.id != entry.id
        and e.lock is not None
        and (e.torch, e.xformers, e.cuda, e.platform)
        == (entry.torch, entry.xformers, entry.cuda, entry.platform)
        and _verdict_for(e, use).verdict in INSTALLABLE
    ]
    if not same:
        return None

    def distance(e: Entry) -> tuple[int, str]:
        try:
            mine, theirs = (int(x.python.split(".")[1]) for x in (entry, e))
        except (IndexError, ValueError):
            return (99, e.id)
        return (abs(mine - theirs), e.id)

    best = min(same, key=distance)
    change = Change(kind="python", asked=entry.python, needed=best.python)
    return f"{best.id!r} is " + suggestion(best, (change,))


def _verdict_for(entry: Entry, use: Use | None) -> Verdict:
    from envbuilder.lockfile.model import use_verdict

    return entry.verdict if use is None else use_verdict(entry.uses, use)


def _refuse(
    lock: CompatLock, entry: Entry, verdict: Verdict, use: Use | None, allowed: bool
) -> None:
    """Refuse a combination that is not verified (for *use*) unless *allowed*, naming the
    verified row to install instead and how to get there."""
    from envbuilder.errors import InputError

    if verdict.verdict in INSTALLABLE or allowed:
        return
    instead = _verified_instead(lock, entry, use)
    said = f" for {use}" if use else ""
    raise InputError(
        f"refusing to install {entry.id!r}: it is {verdict.verdict}{said}"
        + ("; " if verdict.verdict == "unverified" else ", not verified; ")
        + (f"{instead}; " if instead else "no row of its torch and xformers is; ")
        + "pass --allow-unverified to install it anyway"
    )


def _no_gpu(entry: Entry) -> str | None:
    """One line where a CUDA build goes onto a machine without an NVIDIA GPU; None otherwise."""
    if entry.cuda_release is None:
        return None
    from envbuilder.consumer.host import detect_host

    host = detect_host(python=entry.python)
    if host.gpus:
        return None
    return (
        f"! no NVIDIA GPU here ({host.note or 'none found'}): {entry.id} installs, but its CUDA "
        "kernels run only where there is one"
    )


@dataclass(frozen=True)
class _Chosen:
    """The combination ``install`` settled on and the interpreter it goes into."""

    entry: Entry
    verdict: Verdict
    chosen: Interpreter | None  # an existing interpreter to install into
    base: Interpreter | None  # the Python a new ``--venv`` is made from, when named by path
    wanted: str | None  # the version ``--python`` names


def _choose(
    args: InstallRequest, lock: CompatLock, lockfile: Path, say: Callable[[str], None]
) -> _Chosen:
    """The combination (``--id``, else the best match for the interpreter and the options) and
    the interpreter; a named combination is refused before the interpreter is asked anything."""
    from envbuilder.consumer.host import host_family
    from envbuilder.consumer.query import Query, select
    from envbuilder.errors import InputError
    from envbuilder.lockfile.model import use_verdict

    if args.id:
        entry = lock.by_id().get(args.id)
        if entry is None:
            raise InputError(f"no combination {args.id!r} in {lockfile}; see `envbuilder query`")
        verdict = entry.verdict if args.use is None else use_verdict(entry.uses, args.use)
        try:
            _refuse(lock, entry, verdict, args.use, args.allow_unverified)
        except InputError:
            say(f"combination {entry.id}{_for_use(args)}: {verdict.verdict} ({verdict.reason})")
            raise
        return _Chosen(entry, verdict, *_target(args))
    chosen, base, wanted = _target(args)
    known = chosen or base
    query = Query(
        python=known.version if known is not None else wanted,
        cuda=args.cuda,
        torch=args.torch,
        xformers=args.xformers,
        gpu=args.gpu,
        use=args.use,
        os=host_family() or None,  # a Windows user gets a Windows row's lock
    )
    matches = select(lock, query)
    if not matches:
        raise InputError(f"no combination in {lockfile} matches; see `envbuilder query`")
    return _Chosen(matches[0].entry, matches[0].verdict, chosen, base, wanted)


def _for_use(args: InstallRequest) -> str:
    return f" for {args.use}" if args.use else ""


def _say_choice(
    args: InstallRequest, lock: CompatLock, pick: _Chosen, say: Callable[[str], None]
) -> None:
    """Where it installs, what the row's verdict is, and everything the user must know or do
    (no GPU here, advisories, workarounds to apply in their code)."""
    from envbuilder.consumer.advice import advisories, advisory_line

    entry, verdict, use = pick.entry, pick.verdict, _for_use(args)
    if pick.chosen is not None:
        say(f"interpreter: {pick.chosen.describe()}")
    elif pick.base is not None:
        say(f"interpreter: a new venv {args.venv}, from {pick.base.describe()}")
    else:
        say(
            f"interpreter: a new venv {args.venv}, from the Python {pick.wanted or entry.python} "
            "that `uv python find` names"
        )
    say(f"combination {entry.id}{use}: {verdict.verdict} ({verdict.reason})")
    _refuse(lock, entry, verdict, args.use, args.allow_unverified)
    no_gpu = _no_gpu(entry)
    if no_gpu:
        say(no_gpu)
    for item in advisories(verdict):  # a library the row does not pin: said once, never refused
        say(f"! advisory{use}: {advisory_line(entry, item)}")
    for choice in verdict.choices:
        say(
            f"! {choice.check} is verified{use} only with the workaround "
            f"{choice.workaround!r} (measured on its case by {', '.join(choice.evidence)}): "
            "apply it in your code"
        )
    chosen_workarounds = {c.workaround for c in verdict.choices}
    for workaround in verdict.workarounds:
        if not workaround.startswith("cuda-runtime:") and workaround not in chosen_workarounds:
            say(f"! verified only with the workaround {workaround!r}: apply it in your code")


def _venv_python(
    args: InstallRequest, pick: _Chosen, installer: str, uv: str | None, report: Reporter
) -> Path:
    """The interpreter the lock goes into: the chosen one, checked, or a new ``--venv`` made
    from the base (``uv venv``, or the standard library's venv without uv) and checked."""
    from envbuilder.errors import EnvbuilderError

    entry = pick.entry
    if pick.chosen is not None:
        _check_interpreter(pick.chosen, entry.python, entry.id, installer)
        return pick.chosen.executable
    base = pick.base
    if base is None:
        version = pick.wanted or entry.python
        found = Path(_find_python(version, entry.id))
        base = Interpreter(executable=found, version=version, source=f"uv python find {version}")
    _check_interpreter(base, entry.python, entry.id, "uv", base=True)  # --seed: pip
    assert args.venv is not None  # `_target` chooses no interpreter only for a new venv
    python_exe = venv_python(args.venv)
    if uv is None:  # pip without uv: the standard library's venv, with pip in it
        cmd = [str(base.executable), "-m", "venv", str(args.venv)]
    else:
        cmd = [uv, "venv", "--python", str(base.executable), str(args.venv)]
        if installer == "pip":
            cmd.insert(2, "--seed")  # the venv needs pip itself
    report.command(cmd)
    if not args.dry_run:
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        made = subprocess.run(cmd, check=False, env=env)
        if made.returncode != 0:
            raise EnvbuilderError(
                f"{cmd[0]} could not create the venv {args.venv} from {base.executable} "
                f"(exit status {made.returncode}; its message is above)"
            )
        created = Interpreter(executable=python_exe, version=base.version, source="--venv")
        _check_interpreter(created, entry.python, entry.id, installer)
    return python_exe


def _install_command(
    fmt: str, installer: str, uv: str | None, python_exe: Path, indexes: Sequence[str], file: Path
) -> list[str]:
    """The one command that installs the exported lock ``file`` into ``python_exe``."""
    if fmt == "pylock":
        return [
            uv or "uv",
            "pip",
            "install",
            "--python",
            str(python_exe),
            "--no-build",
            "-r",
            str(file),
        ]
    if installer == "uv":
        return [
            uv or "uv", "pip", "install", "--python", str(python_exe), "--require-hashes",
            "--no-deps", "--no-build", *indexes, "-r", str(file),
        ]  # fmt: skip
    return [
        str(python_exe), "-m", "pip", "install", "--require-hashes", "--no-deps",
        "--only-binary", ":all:", *indexes, "-r", str(file),
    ]  # fmt: skip


def install(args: InstallRequest, report: Reporter) -> int:
    """Choose the interpreter and the combination, refuse an unverified one, install its lock
    with uv or pip. ``--dry-run`` makes every check the real run makes and prints the commands
    it would run; it only writes the exported lock, at the printed path."""
    from envbuilder.consumer.export import carried, exported_entry
    from envbuilder.consumer.published import lockfile_choice
    from envbuilder.consumer.published_wheel import lockfile_url, wheel_for_install
    from envbuilder.files import write_atomic
    from envbuilder.lockfile.read import load_lockfile
    from envbuilder.lockfile.sourcebuilds import staged_wheel
    from envbuilder.lockfile.sourcebuilds import wheel_install_command as built_command

    say = _wrapping(report)
    lockfile, source = lockfile_choice(args.lock, args.settings, with_locks=True)
    if source:
        say(source)
    lock = load_lockfile(lockfile)
    pick = _choose(args, lock, lockfile, say)
    entry = pick.entry
    _say_choice(args, lock, pick, say)
    cache = args.build_cache or args.settings.cache_dir / "source-builds"
    built, fetched = wheel_for_install(
        entry, wheel=args.wheel, build_cache=cache,
        lock_url=lockfile_url(args.lock, args.settings), settings=args.settings,
        download=not args.dry_run,
    )  # fmt: skip
    if fetched:
        say(fetched)
    installer, uv = _installer(args, report)
    from_record = carried(lockfile, entry)  # the carried snapshot: no pylock, no URL
    fmt = "pylock" if installer == "uv" and not from_record else "requirements"
    # the lock and the interpreter are verified before the disk is touched, dry run or not
    data = exported_entry(lockfile, entry, fmt, with_suite=args.with_suite)
    indexes: list[str] = []
    if from_record:
        indexes = index_options(entry, installer, args.settings.environ, args.pip_indexes)
        say(
            "files: from your configured indexes, each checked against the sha256 the lockfile records"
        )
    python_exe = _venv_python(args, pick, installer, uv, report)
    file = _kept(args.settings, entry.id, fmt)
    write_atomic(file, data)
    say(f"lock: {file} ({fmt} of {entry.id}, from {lockfile})")
    cmd = _install_command(fmt, installer, uv, python_exe, indexes, file)
    report.line("+ " + redact_text(shlex.join(cmd)))  # a command stays one pasteable line
    then = None  # a source build's wheel goes in after the lock's files
    if built is not None:
        staged = staged_wheel(entry, built, file.parent)
        then = built_command(
            staged, python_exe, installer, (uv or "uv") if installer == "uv" else None
        )
        report.command(then)
    return _run_install(args, entry, fmt, cmd, then, python_exe, report, say)


def _run_install(
    args: InstallRequest,
    entry: Entry,
    fmt: str,
    cmd: list[str],
    then: list[str] | None,
    python_exe: Path,
    report: Reporter,
    say: Callable[[str], None],
) -> int:
    """Run the install (and a source build's wheel after it), or say what a dry run would;
    then hook the row's CUDA runtime into the venv where it needs one."""
    prefix = _prefix(python_exe, args.venv)
    runtime = runtime_line(entry, prefix) if entry.extra_runtime else None
    if args.dry_run:
        if runtime:
            report.line(_hooked(entry, prefix, apply=False) or runtime)
        say("dry run: nothing installed; the commands above do it")
        return 0
    # uv reads a pylock only as a preview feature and says so on every install; the
    # variable turns the warning off (a uv that predates it ignores it)
    preview = ",".join(filter(None, [os.environ.get("UV_PREVIEW_FEATURES"), "pylock"]))
    quiet = {**os.environ, "UV_PREVIEW_FEATURES": preview} if fmt == "pylock" else None
    result = subprocess.run(cmd, check=False, env=quiet)
    if result.returncode == 0 and then is not None:
        result = subprocess.run(then, check=False)
    if result.returncode != 0:
        say(f"✕ installing {entry.id} failed (exit status {result.returncode})")
        return 1
    say(f"✓ installed {entry.id} into {python_exe}")
    if runtime:
        report.line(_hooked(entry, prefix, apply=True) or runtime)
    return 0


#: uv's own settings of where packages come from; where one is set, uv's configuration wins
_UV_INDEX_VARIABLES = (
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
)


def index_options(
    entry: Entry,
    installer: str,
    environ: Mapping[str, str],
    pip_indexes: Sequence[str] = (),
) -> list[str]:
    """The installer's options naming where the carried lockfile's files come from: the
    user's configuration, never a host of ours.

    pip reads its own configuration. uv does not read pip's: where uv's environment names no
    index, *pip_indexes* (pip's ``--index-url``/``--extra-index-url`` options, read at the
    command's edge) are passed on. A torch from a PyTorch-style index (``<base>/<cuda>``)
    takes ``$PYTORCH_INDEX_URL`` as the base, else uv's own ``--torch-backend``; pip without
    the variable is told to set it. Several indexes may serve one name: every file is
    hash-pinned, so uv may take the best match of all."""
    from envbuilder.errors import InputError

    options: list[str] = []
    if installer == "uv" and not any(environ.get(v) for v in _UV_INDEX_VARIABLES):
        options += pip_indexes
    torch = entry.torch_build
    if torch is not None and torch.index != "default" and torch.cuda is not None:
        base = environ.get("PYTORCH_INDEX_URL", "").strip()
        if base:
            options += ["--extra-index-url", f"{base.rstrip('/')}/{torch.cuda.tag}"]
        elif installer == "uv":
            options += ["--torch-backend", torch.cuda.tag]
        else:
            raise InputError(
                f"{entry.id!r} takes torch {torch.version} from a PyTorch-style index (one "
                f"sub-index per CUDA build): set PYTORCH_INDEX_URL to its base URL (the "
                f"{torch.cuda.tag} files lie under <base>/{torch.cuda.tag}), or install with uv "
                "(its --torch-backend knows the index)"
            )
    if installer == "uv" and "--extra-index-url" in options:
        options += ["--index-strategy", "unsafe-best-match"]
    return options


def _wrapping(report: Reporter) -> Callable[[str], None]:
    """``report.line`` with each line broken between words to the terminal's width (200
    where output is not a terminal); commands are printed whole, to be pasted."""
    from envbuilder.consumer.advice import wrapped
    from envbuilder.reporter import terminal_size

    width = max(terminal_size(200, 40).columns, 40)
    return lambda text: report.line(wrapped(text, width))


def _hooked(entry: Entry, prefix: str, *, apply: bool) -> str | None:
    """The activate hooks' lines for *entry*'s added runtime (`announce`); None for a
    Windows row, whose runtime goes on ``PATH`` (`runtime_line` says how)."""
    return None if on_windows(entry) else announce(entry, prefix, apply=apply)


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
    extension needs, prepended to what is there (never replacing it); for a Windows row,
    the directory to put first on ``PATH``, where Windows looks for DLLs."""
    if not entry.extra_runtime:
        return None
    windows = on_windows(entry)
    path = library_path(entry.extra_runtime, python=entry.python, venv=prefix, windows=windows)
    if not path:
        return None
    if windows:
        return (
            f"! {entry.id} adds a CUDA runtime for xformers' extension: before running, put "
            f'{path} first on PATH (PowerShell: $env:PATH = "{path};$env:PATH") '
            "(`envbuilder doctor` checks that the extension loads)"
        )
    return (
        f"! {entry.id} adds a CUDA runtime for xformers' extension: before running, "
        f'export LD_LIBRARY_PATH="{path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
        "(prepended; `envbuilder doctor` checks that the extension loads)"
    )


def on_windows(entry: Entry) -> bool:
    """Whether *entry* was resolved for Windows (its runtime goes on ``PATH``, not
    ``LD_LIBRARY_PATH``, and the POSIX activate hooks do not apply)."""
    from envbuilder.target import platform_family

    try:
        return platform_family(entry.platform) == "windows"
    except ValueError:
        return False


def venv_python(venv: Path, *, windows: bool = os.name == "nt") -> Path:
    """The interpreter of the virtual environment *venv* (``Scripts\\python.exe`` on Windows)."""
    return venv / "Scripts" / "python.exe" if windows else venv / "bin" / "python"
