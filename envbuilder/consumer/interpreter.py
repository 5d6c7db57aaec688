"""The Python a consumer command acts on (``doctor``, ``install``, ``query --here``).

As pip and uv choose theirs, in this order:

| source            | interpreter                                                       |
|-------------------|-------------------------------------------------------------------|
| ``--python PATH`` | that interpreter (or a venv directory's ``bin/python``, or a      |
|                   | command on PATH such as ``python3.12``)                           |
| ``--python X.Y``  | the interpreter below when it is Python X.Y, else the one         |
|                   | ``uv python find X.Y`` names (where uv is installed; no download),|
|                   | else ``pythonX.Y`` on PATH                                        |
| ``$VIRTUAL_ENV``  | the active virtual environment's ``bin/python``                   |
| ``$CONDA_PREFIX`` | the active conda environment's ``bin/python``                     |
| ``PATH``          | the first ``python3``                                             |

envbuilder's own interpreter is never chosen unless it is the one found: a tool
installed with ``uv tool`` or ``pipx`` lives in a venv of its own, and what the user
wants checked or installed into is their environment. `parse_python` reads the option
(a version or a path, detected); `choose` finds the interpreter and asks it its version.
An interpreter that does not run (a pyenv shim of a version not selected) is one short
line naming it and its exit status (`BrokenInterpreter`), never its stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from envbuilder.errors import InputError, MissingToolError

__all__ = [
    "BrokenInterpreter",
    "Interpreter",
    "PythonRequest",
    "choose",
    "has_pip",
    "interpreter_version",
    "parse_python",
]

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?")

#: What ``--python`` accepts, for error messages.
ACCEPTED = (
    "give a Python version (3.12) or an interpreter: a path (.venv/bin/python), a virtual "
    "environment's directory (.venv) or a command on PATH (python3.12)"
)


@dataclass(frozen=True, kw_only=True)
class PythonRequest:
    """What ``--python`` asked for: exactly one of a version (``3.12``) and a path."""

    text: str
    version: str | None = None
    path: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Interpreter:
    executable: Path
    version: str  # "3.12"
    source: str  # how it was chosen: "--python", "$VIRTUAL_ENV", "$CONDA_PREFIX", "python3 on PATH"

    def describe(self) -> str:
        return f"Python {self.version} at {self.executable} ({self.source})"


class BrokenInterpreter(InputError):
    """An interpreter that does not run: *executable* and, in a few words, why."""

    def __init__(self, option: str, executable: Path, why: str) -> None:
        super().__init__(f"{option} {str(executable)!r} does not run ({why})")
        self.executable = executable
        self.why = why


def _venv_python(directory: Path) -> Path:
    return directory / "bin" / "python"


def parse_python(
    text: str, *, which: Callable[[str], str | None] = shutil.which, option: str = "--python"
) -> PythonRequest:
    """``3.12`` (or ``3.12.4``) is a version, anything else an interpreter: a path, a venv
    directory or a command on PATH. Neither is bad input saying what to pass."""
    value = text.strip()
    if m := _VERSION.fullmatch(value):
        if m.group(1) != "3":
            raise InputError(f"bad {option} {text!r}: envbuilder knows only Python 3; {ACCEPTED}")
        return PythonRequest(text=text, version=f"{m.group(1)}.{m.group(2)}")
    if not value:
        raise InputError(f"bad {option} {text!r}: {ACCEPTED}")
    path = Path(value).expanduser()
    if os.sep in value or path.exists():
        if path.is_dir():
            if not _venv_python(path).exists():
                raise InputError(
                    f"bad {option} {text!r}: a directory without bin/python is not an "
                    f"environment; {ACCEPTED}"
                )
            path = _venv_python(path)
        elif not path.exists():
            raise InputError(f"bad {option} {text!r}: no such file; {ACCEPTED}")
        return PythonRequest(text=text, path=path.absolute())
    found = which(value)
    if found is None:
        raise InputError(f"bad {option} {text!r}: not a version, a path or a command; {ACCEPTED}")
    return PythonRequest(text=text, path=Path(found))


def _pyvenv(executable: Path) -> dict[str, str]:
    """The ``pyvenv.cfg`` of the venv *executable* is the ``bin/python`` of, else {}."""
    config = Path(executable).parent.parent / "pyvenv.cfg"
    try:
        text = config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    return values


def interpreter_version(executable: Path, *, option: str = "--python") -> str:
    """``major.minor`` of *executable*: the running one's, a venv's from its ``pyvenv.cfg``
    (``version``, or uv's and virtualenv's ``version_info``), else asked by running it."""
    if Path(executable).absolute() == Path(sys.executable).absolute():
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    config = _pyvenv(executable)
    recorded = config.get("version") or config.get("version_info") or ""
    if m := re.match(r"(\d+)\.(\d+)", recorded):
        return f"{m.group(1)}.{m.group(2)}"
    try:
        out = subprocess.run(
            [str(executable), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.CalledProcessError as e:
        raise BrokenInterpreter(option, executable, f"exit status {e.returncode}") from e
    except subprocess.TimeoutExpired as e:
        raise BrokenInterpreter(option, executable, "no answer in 60 s") from e
    except OSError as e:
        raise BrokenInterpreter(option, executable, e.strerror or type(e).__name__) from e
    version = out.stdout.strip()
    if not _VERSION.fullmatch(version):
        raise InputError(f"{option} {str(executable)!r} printed {version!r}, not its version")
    return version


def _active(
    environ: Mapping[str, str], which: Callable[[str], str | None]
) -> tuple[Path, str] | None:
    """The interpreter of the active venv, else conda env, else ``python3`` on PATH."""
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = environ.get(variable)
        if not prefix:
            continue
        if not _venv_python(Path(prefix)).exists():
            raise InputError(
                f"${variable} is {prefix!r}, which has no bin/python: activate an existing "
                "environment (or deactivate this one), or pass --python"
            )
        return _venv_python(Path(prefix)), f"${variable}"
    found = which("python3")
    return (Path(found), "the first python3 on PATH") if found else None


def has_pip(executable: Path) -> bool:
    """Whether ``executable -m pip`` works: for a venv that sees no system packages, whether
    pip lies in its site-packages; else asked by running it."""
    config = _pyvenv(executable)
    if config and config.get("include-system-site-packages", "false").lower() == "false":
        root = Path(executable).parent.parent
        return any(root.glob("lib/python*/site-packages/pip/__init__.py"))
    done = subprocess.run(
        [str(executable), "-m", "pip", "--version"], capture_output=True, text=True, check=False
    )
    return done.returncode == 0


NOTHING_ACTIVE = "no $VIRTUAL_ENV, no $CONDA_PREFIX and no python3 on PATH"


def choose(
    request: PythonRequest | None,
    environ: Mapping[str, str] | None = None,
    *,
    which: Callable[[str], str | None] = shutil.which,
    version_of: Callable[[Path], str] = interpreter_version,
    uv_find: Callable[[str, Callable[[str], str | None]], Path | None] | None = None,
) -> Interpreter:
    """The interpreter *request* (``--python``, None when not given) means; none is a
    `MissingToolError` saying how to name one."""
    environ = os.environ if environ is None else environ
    if request is not None and request.path is not None:
        return Interpreter(
            executable=request.path, version=version_of(request.path), source="--python"
        )
    active = _active(environ, which)
    if request is None:
        if active is None:
            raise MissingToolError(
                f"no Python to act on ({NOTHING_ACTIVE}): activate the environment, or pass "
                "--python PATH"
            )
        return Interpreter(executable=active[0], version=version_of(active[0]), source=active[1])
    want = request.version
    assert want is not None  # `parse_python`: a version where there is no path
    tried = []
    if active is not None:
        have = version_of(active[0])
        if have == want:
            return Interpreter(
                executable=active[0], version=have, source=f"--python {want}, {active[1]}"
            )
        tried.append(f"{active[1]} is Python {have}")
    found_by_uv = (uv_find or uv_python_find)(want, which)
    if found_by_uv is not None:
        try:
            have = version_of(found_by_uv)
        except BrokenInterpreter as e:
            tried.append(f"{e.executable} (from uv) does not run ({e.why})")
        else:
            if have == want:
                return Interpreter(
                    executable=found_by_uv, version=have, source=f"uv python find {want}"
                )
    elif which("uv") is not None:
        tried.append(f"`uv python find {want}` finds none")
    command = f"python{want}"
    found = which(command)
    if found is not None:
        try:
            have = version_of(Path(found))
        except BrokenInterpreter as e:  # a pyenv shim of a version that is not selected
            tried.append(f"{found} does not run ({e.why})")
        else:
            if have == want:
                return Interpreter(
                    executable=Path(found),
                    version=have,
                    source=f"--python {want}, {command} on PATH",
                )
            tried.append(f"{found} is Python {have}")
    else:
        tried.append(f"no {command} on PATH")
    raise MissingToolError(
        f"no Python {want} found: {'; '.join(tried) or NOTHING_ACTIVE}. Install one "
        f"(`uv python install {want}`) or pass --python PATH"
    )


def uv_python_find(version: str, which: Callable[[str], str | None] = shutil.which) -> Path | None:
    """The interpreter ``uv python find VERSION`` names (never downloading one); None where
    uv is not installed or finds none."""
    uv = which("uv")
    if uv is None:
        return None
    try:
        done = subprocess.run(
            [uv, "python", "find", version],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return Path(lines[0]) if done.returncode == 0 and lines else None
